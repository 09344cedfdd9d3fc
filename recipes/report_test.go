package recipes_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/recipes"
)

// Three tabs, on three pods (each a Runner on a pool of its own), and a
// fourth tab on the first pod, ask for one user's report at once: the API
// is called once, and every tab gets that report, three of them as shared
// (having waited for it, or, coming after it was saved, reused it within
// WithReuseFor); a reload within WithReuseFor gets it without a call.
func TestReportHandler_TabsShareOneReport(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		entered := make(chan struct{}, 8)
		var calls atomic.Int64
		release := make(chan struct{})
		var releaseOnce sync.Once
		api := func(ctx context.Context, user string) (recipes.Report, error) {
			calls.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
				return recipes.Report{}, ctx.Err()
			}
			return recipes.Report{User: user, Score: 97}, nil
		}
		const pods = 3
		urls := make([]string, pods)
		for i := range pods {
			runner := newRunner[recipes.Report](t, s.Open(t, nil), gormlease.WithReuseFor(time.Minute))
			handler := recipes.ReportHandler(runner, api)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				entered <- struct{}{}
				handler.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			urls[i] = srv.URL
		}
		t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before the servers close
		user := newTarget(t)
		get := func(url string) (recipes.Report, bool) {
			res, err := http.Get(url + "?user=" + user)
			if !assert.NoError(t, err) {
				return recipes.Report{}, false
			}
			defer res.Body.Close()
			assert.Equal(t, http.StatusOK, res.StatusCode)
			var rep recipes.Report
			assert.NoError(t, json.NewDecoder(res.Body).Decode(&rep))
			return rep, res.Header.Get("X-Report-Shared") == "true"
		}

		tabs := append(urls, urls[0])
		reports := make([]recipes.Report, len(tabs))
		shared := make([]bool, len(tabs))
		var wg sync.WaitGroup
		for i, url := range tabs {
			wg.Go(func() { reports[i], shared[i] = get(url) })
		}
		// Every tab's request is in, the first's report not yet made: the
		// others wait for it, or, should one come late, reuse it.
		for range tabs {
			<-entered
		}
		releaseOnce.Do(func() { close(release) })
		wg.Wait()
		assert.EqualValues(t, 1, calls.Load(), "the API was called more than once")
		nShared := 0
		for i := range tabs {
			assert.Equal(t, reports[0], reports[i], "tab %d got another report", i)
			if shared[i] {
				nShared++
			}
		}
		assert.Equal(t, len(tabs)-1, nShared)
		assert.Equal(t, user, reports[0].User)
		assert.Positive(t, reports[0].Generation)

		again, wasShared := get(urls[1])
		<-entered
		assert.Equal(t, reports[0], again, "the reload got another report")
		assert.True(t, wasShared)
		assert.EqualValues(t, 1, calls.Load(), "the reload called the API")

		res, err := http.Get(urls[0])
		require.NoError(t, err)
		res.Body.Close()
		<-entered
		assert.Equal(t, http.StatusBadRequest, res.StatusCode)
	})
}
