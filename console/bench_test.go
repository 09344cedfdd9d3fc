package console_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/gormlease/gormlease/internal/testdb"
)

// BenchmarkListPage serves the list page, with its counts, of 100,000
// rows on PostgreSQL (1,000 live, 100 expired, 5 paused, the rest released),
// with each state filter, each order and a holder's search: one page of
// 200 rows an op, timed from the request to the last byte of the page. It
// reports the mean, the median and the slowest page; docs/operating.md has
// the figures, which must stay under 50 ms a page. Run it with
//
//	cd console && CI=true go test -run '^$' -bench ListPage -benchtime 50x .
func BenchmarkListPage(b *testing.B) {
	s := testdb.Postgres(b)
	db := bulk(b, s, 100000, []int{1000, 25000, 50000, 75000, 99999}, []int{300, 400})
	h, _ := newConsole(b, db)
	for _, c := range []struct{ name, query string }{
		{"all", "/"},
		{"live", "/?state=live"},
		{"expired", "/?state=expired"},
		{"released", "/?state=released"},
		{"paused", "/?state=paused"},
		{"order=age", "/?order=age"},
		{"order=held", "/?order=held"},
		{"order=expiry", "/?order=expiry"},
		{"holder", "/?holder=worker-3"},
		{"expired,order=expiry", "/?state=expired&order=expiry"},
	} {
		b.Run(c.name, func(b *testing.B) {
			serve := func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, c.query, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", c.query, w.Code, w.Body.String())
				}
			}
			serve() // the first, untimed: the pool's connections are open
			var took []time.Duration
			for b.Loop() {
				start := time.Now()
				serve()
				took = append(took, time.Since(start))
			}
			slices.Sort(took)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(b.Elapsed())/float64(b.N), "ms/page")
			b.ReportMetric(ms(took[len(took)/2]), "median-ms")
			b.ReportMetric(ms(took[len(took)-1]), "max-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
