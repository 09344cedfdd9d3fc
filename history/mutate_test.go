package history

import "testing"

// breakFence takes the token check out of the statements that record a
// save, in every form the backends send them, and out of no other.
func TestBreakFence(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{
			"UPDATE job_lease SET released_at = now(), saved_generation = generation, saved_at = now() WHERE target_id = $1 AND lease_token = $2 AND released_at IS NULL",
			"UPDATE job_lease SET released_at = now(), saved_generation = generation, saved_at = now() WHERE target_id = $1 AND (lease_token = $2 OR 1 = 1) AND released_at IS NULL",
		},
		{
			"UPDATE job_lease SET saved_generation = generation, saved_at = NOW(6) WHERE target_id = ? AND lease_token = ? AND released_at IS NULL",
			"UPDATE job_lease SET saved_generation = generation, saved_at = NOW(6) WHERE target_id = ? AND (lease_token = ? OR 1 = 1) AND released_at IS NULL",
		},
		{
			"BEGIN ISOLATION LEVEL READ COMMITTED; UPDATE job_lease SET released_at = now(), saved_generation = generation WHERE target_id = E'a' AND lease_token = '0b7e9c1e-58c4-4d6f-9d0a-3c1f1a2b3c4d' AND released_at IS NULL",
			"BEGIN ISOLATION LEVEL READ COMMITTED; UPDATE job_lease SET released_at = now(), saved_generation = generation WHERE target_id = E'a' AND (lease_token = '0b7e9c1e-58c4-4d6f-9d0a-3c1f1a2b3c4d' OR 1 = 1) AND released_at IS NULL",
		},
		{ // a heartbeat is left alone
			"UPDATE job_lease SET updated_at = now() WHERE target_id = $1 AND lease_token = $2 AND released_at IS NULL",
			"UPDATE job_lease SET updated_at = now() WHERE target_id = $1 AND lease_token = $2 AND released_at IS NULL",
		},
	} {
		if got := breakFence(c.in); got != c.want {
			t.Errorf("breakFence(%q)\n = %q\nwant %q", c.in, got, c.want)
		}
	}
}
