//go:build gormlease_mutate_fence

package backend

// fenceWhere, built with the tag gormlease_mutate_fence, is a broken fence
// for the history checker's mutation test (history/): the fenced commit
// still binds the caller's token but no longer compares it, so a holder
// whose lease was taken over saves over the new holder's row. Never build
// a program with this tag.
const fenceWhere = " WHERE target_id = ? AND (lease_token = ? OR 1 = 1) AND released_at IS NULL"
