package recipes

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
)

// Report is the slow report that ReportHandler serves.
type Report struct {
	// User is the user the report is about.
	User string `json:"user"`
	// Score is what the slow call computed.
	Score int `json:"score"`
	// Generation is the lease generation that made the report.
	Generation int64 `json:"generation"`
}

// ReportHandler serves GET ?user=ID with the user's report, made by makeReport,
// a slow call (an external API), under runner.Do: the tabs (and pods) that
// ask for one user's report while it is being made wait for it, holding no
// connection, and all get the one report that was made and saved
// (gormlease.SaveJSON); the response's X-Report-Shared header says whether
// this request waited for another's. With gormlease.WithReuseFor on
// runner, a request soon after gets the saved report without a new call.
// A request whose shared job failed gets 502; a request without a user,
// 400.
func ReportHandler(runner *gormlease.Runner[Report], makeReport func(ctx context.Context, user string) (Report, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := r.URL.Query().Get("user")
		if user == "" {
			http.Error(w, "user is required", http.StatusBadRequest)
			return
		}
		id := "report:" + user
		report, shared, err := runner.Do(r.Context(), id,
			func(ctx context.Context) (Report, error) {
				rep, err := makeReport(ctx, user)
				lease, _ := gormlease.LeaseFromContext(ctx)
				rep.Generation = lease.Generation
				return rep, err
			},
			gormlease.SaveJSON[Report],
			func(tx *gorm.DB) (Report, error) {
				rep, _, err := gormlease.LoadJSON[Report](tx.Statement.Context, tx, id)
				return rep, err
			})
		switch {
		case errors.Is(err, gormlease.ErrSharedJobFailed):
			http.Error(w, "the report failed; reload to try again", http.StatusBadGateway)
			return
		case err != nil:
			http.Error(w, "the report failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if shared {
			w.Header().Set("X-Report-Shared", "true")
		}
		_ = json.NewEncoder(w).Encode(report)
	})
}
