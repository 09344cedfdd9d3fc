package gormlease

import "github.com/gormlease/gormlease/internal/ops"

// An operator's steps (List, Pause, ForceRelease, Prune, ...) live in
// package admin, which reaches a Repository's parts, and checks its
// arguments and words its errors as the Repository's own steps do,
// through internal/ops: package gormlease hands them over here.
func init() {
	ops.Parts = func(repo any) (ops.Repository, bool) {
		r, ok := repo.(*Repository)
		if !ok || r == nil {
			return ops.Repository{}, false
		}
		return ops.Repository{DB: r.db, Backend: r.backend, LeaseTable: r.tables.lease, WaitKey: r.waitKey, Retry: r.retry}, true
	}
	ops.CheckTargetID = checkTargetID
	ops.CheckText = checkText
	ops.TruncateUTF8 = truncateUTF8
	ops.Invalidf = invalidf
	ops.Wrapf = wrapf
}
