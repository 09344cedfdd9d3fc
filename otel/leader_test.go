package gormleaseotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/observe"
	gormleaseotel "github.com/gormlease/gormlease/otel"
)

// process is one process that campaigns for a role: an Elector that
// reports to a meter of its own.
type process struct {
	elector *gormlease.Elector
	reader  *sdkmetric.ManualReader
}

func newProcess(t *testing.T, db *gorm.DB, tables gormlease.TableOption, role, holder string) *process {
	t.Helper()
	obs, _, reader := instrumented(t)
	e, err := gormlease.NewElector(db, role, tables, gormlease.WithObserver(obs), gormlease.WithHolder(holder),
		gormlease.WithHeartbeatInterval(200*time.Millisecond), gormlease.WithLeaseTimeout(2*time.Second))
	require.NoError(t, err)
	return &process{elector: e, reader: reader}
}

// collect reads p's metrics.
func (p *process) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, p.reader.Collect(context.Background(), &rm))
	return rm
}

// leaderStatus is p's leader status of role, and whether it has one.
func (p *process) leaderStatus(t *testing.T, role string) (int64, bool) {
	t.Helper()
	v, ok := sums(t, p.collect(t), gormleaseotel.MetricLeaderStatus, gormleaseotel.AttrRole)[role]
	return v, ok
}

// leaderless returns the count and sum of the leaderless histogram of role.
func leaderless(rm metricdata.ResourceMetrics, role string) (uint64, time.Duration) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok || m.Name != gormleaseotel.MetricLeaderless {
				continue
			}
			for _, p := range h.DataPoints {
				if v, _ := p.Attributes.Value(gormleaseotel.AttrRole); v.AsString() == role {
					return p.Count, time.Duration(p.Sum * float64(time.Second))
				}
			}
		}
	}
	return 0, 0
}

// ended returns the terms ended of role, by cause.
func ended(t *testing.T, rm metricdata.ResourceMetrics, role string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != gormleaseotel.MetricTermsEnded {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := p.Attributes.Value(gormleaseotel.AttrRole); v.AsString() == role {
					cause, _ := p.Attributes.Value(gormleaseotel.AttrTermCause)
					out[cause.AsString()] += p.Value
				}
			}
		}
	}
	return out
}

// waitUntil polls cond every 10ms until it holds, failing t after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// goLead calls e.Lead on a goroutine that ends before the test does.
func goLead(t *testing.T, ctx context.Context, e *gormlease.Elector, lead func(context.Context) error) <-chan error {
	ctx, cancel := context.WithCancel(ctx)
	done, returned := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(returned)
		done <- e.Lead(ctx, lead)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-returned:
		case <-time.After(30 * time.Second):
			t.Error("Lead did not return")
		}
	})
	return done
}

func recv[V any](t *testing.T, ch <-chan V, what string) V {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s within 20s", what)
		panic("unreachable")
	}
}

// Two processes campaign for a role. The first leads; an operator's forced
// release deposes it and the standby leads; the standby resigns and the
// first leads again, until its context ends. Each process's status flips,
// its terms are counted by the cause of their ends, and the time the role
// went without a leader is recorded by the process that ended it.
func TestObserver_LeaderMetrics(t *testing.T) {
	eachDB(t, func(t *testing.T, d database, db *gorm.DB, tables gormlease.TableOption, table string) {
		role := "otel-role-" + uuid.NewString()[:8]
		a := newProcess(t, db, tables, role, "process-a")
		b := newProcess(t, db, tables, role, "process-b")
		op := admin.New(a.elector.Repository())

		aLeads := make(chan struct{})
		aDone := goLead(t, context.Background(), a.elector, func(ctx context.Context) error {
			close(aLeads)
			<-ctx.Done()
			return nil
		})
		recv(t, aLeads, "a to lead")
		status, ok := a.leaderStatus(t, role)
		require.True(t, ok, "a's status")
		assert.EqualValues(t, 1, status, "a leads")
		assert.Equal(t, map[string]int64{role: 1}, sums(t, a.collect(t), gormleaseotel.MetricTermsBegun, gormleaseotel.AttrRole))
		count, _ := leaderless(a.collect(t), role)
		assert.Zero(t, count, "the role's first term cannot tell how long it went without a leader")

		bLeads, bResign := make(chan time.Time, 1), make(chan struct{})
		bDone := goLead(t, context.Background(), b.elector, func(context.Context) error {
			bLeads <- time.Now()
			<-bResign
			return nil
		})
		waitUntil(t, 20*time.Second, "b waiting", func() bool { return op.Waiters(role).Waits >= 1 })
		status, ok = b.leaderStatus(t, role)
		assert.True(t, ok, "a standby's status is there, at 0, before it leads")
		assert.Zero(t, status)

		// An operator releases a's lease: a's heartbeat finds it gone, and
		// b, woken, leads.
		forced := time.Now()
		_, err := op.ForceRelease(context.Background(), role)
		require.NoError(t, err)
		assert.ErrorIs(t, recv(t, aDone, "a's Lead"), gormlease.ErrLeaseLost)
		bLed := recv(t, bLeads, "b to lead")
		rmA, rmB := a.collect(t), b.collect(t)
		assert.Equal(t, map[string]int64{role: 0}, sums(t, rmA, gormleaseotel.MetricLeaderStatus, gormleaseotel.AttrRole))
		assert.Equal(t, map[string]int64{"taken_over": 1}, ended(t, rmA, role))
		assert.Equal(t, map[string]int64{role: 1}, sums(t, rmB, gormleaseotel.MetricLeaderStatus, gormleaseotel.AttrRole))
		assert.Equal(t, map[string]int64{role: 1}, sums(t, rmB, gormleaseotel.MetricTermsBegun, gormleaseotel.AttrRole))
		count, sum := leaderless(rmB, role)
		require.EqualValues(t, 1, count, "b's term records how long the role went without a leader")
		t.Logf("%s: b led %v after the forced release; it reports %v without a leader", d.name, bLed.Sub(forced), sum)
		assert.Positive(t, sum)
		// From the release, which came after forced, to b's term (5ms for
		// the rounding of the database's clock readings): not the time b
		// waited while a led.
		assert.LessOrEqual(t, sum, bLed.Sub(forced)+5*time.Millisecond)

		// b resigns; a campaigns again and leads, from b's release.
		resigning := time.Now()
		close(bResign)
		require.NoError(t, recv(t, bDone, "b's Lead"))
		ctx, cancel := context.WithCancel(context.Background())
		aLeadsAgain := make(chan time.Time, 1)
		aDone = goLead(t, ctx, a.elector, func(ctx context.Context) error {
			aLeadsAgain <- time.Now()
			<-ctx.Done()
			return nil
		})
		aLed := recv(t, aLeadsAgain, "a to lead again")
		rmB = b.collect(t)
		assert.Equal(t, map[string]int64{role: 0}, sums(t, rmB, gormleaseotel.MetricLeaderStatus, gormleaseotel.AttrRole))
		assert.Equal(t, map[string]int64{"resigned": 1}, ended(t, rmB, role))
		status, _ = a.leaderStatus(t, role)
		assert.EqualValues(t, 1, status, "a leads again")
		count, sum = leaderless(a.collect(t), role)
		require.EqualValues(t, 1, count)
		assert.Positive(t, sum)
		assert.LessOrEqual(t, sum, aLed.Sub(resigning)+5*time.Millisecond)

		// a's context ends, and with it the term.
		cancel()
		assert.ErrorIs(t, recv(t, aDone, "a's Lead"), context.Canceled)
		rmA = a.collect(t)
		assert.Equal(t, map[string]int64{role: 0}, sums(t, rmA, gormleaseotel.MetricLeaderStatus, gormleaseotel.AttrRole))
		assert.Equal(t, map[string]int64{role: 2}, sums(t, rmA, gormleaseotel.MetricTermsBegun, gormleaseotel.AttrRole))
		assert.Equal(t, map[string]int64{"taken_over": 1, "cancelled": 1}, ended(t, rmA, role))
	})
}

// series counts the data points of every metric in rm.
func series(rm metricdata.ResourceMetrics) int {
	n := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				n += len(data.DataPoints)
			case metricdata.Histogram[float64]:
				n += len(data.DataPoints)
			}
		}
	}
	return n
}

// attributeValues returns every attribute value of every data point in rm.
func attributeValues(rm metricdata.ResourceMetrics) map[string]bool {
	out := map[string]bool{}
	add := func(set attribute.Set) {
		for _, kv := range set.ToSlice() {
			out[kv.Value.String()] = true
		}
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					add(p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					add(p.Attributes)
				}
			}
		}
	}
	return out
}

// The leader metrics have a series per role, never per target: a process
// that leads a role and runs many Runs, on many targets, with the same
// Observer, adds no series as it runs Runs on more targets, and no target
// ID is an attribute.
func TestObserver_LeaderMetricsCardinality(t *testing.T) {
	eachDB(t, func(t *testing.T, d database, db *gorm.DB, tables gormlease.TableOption, table string) {
		obs, _, reader := instrumented(t)
		role := "otel-role-" + uuid.NewString()[:8]
		e, err := gormlease.NewElector(db, role, tables, gormlease.WithObserver(obs))
		require.NoError(t, err)
		r, err := gormlease.NewRunner[string](db, tables, gormlease.WithObserver(obs))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		leads := make(chan struct{})
		goLead(t, ctx, e, func(ctx context.Context) error {
			close(leads)
			<-ctx.Done()
			return nil
		})
		recv(t, leads, "the elector to lead")

		targets := map[string]bool{}
		runs := func(n int) metricdata.ResourceMetrics {
			for range n {
				target := "otel-target-" + uuid.NewString()
				targets[target] = true
				_, err := r.RunWait(ctx, target, func(context.Context) (string, error) { return "done", nil },
					func(*gorm.DB, string) error { return nil })
				require.NoError(t, err)
			}
			var rm metricdata.ResourceMetrics
			require.NoError(t, reader.Collect(ctx, &rm))
			return rm
		}
		before := runs(5)
		after := runs(50)
		assert.Equal(t, series(before), series(after), "series added by Runs on more targets")
		values := attributeValues(after)
		for target := range targets {
			require.False(t, values[target], "a target ID is an attribute")
		}
		assert.Equal(t, map[string]int64{role: 1}, sums(t, after, gormleaseotel.MetricLeaderStatus, gormleaseotel.AttrRole),
			"the leader status's one series is the role's")
		assert.Equal(t, map[string]int64{role: 1}, sums(t, after, gormleaseotel.MetricTermsBegun, gormleaseotel.AttrRole))
	})
}

// scrape returns what a Prometheus server scraping reg reads.
func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// The leader metrics under the names and labels that docs/operating.md's
// queries use, as the OpenTelemetry Prometheus exporter serves them; with
// WithClientGoLeaderStatus, client-go's leader_election_master_status too.
func TestObserver_LeaderMetricsAsPrometheusScrapesThem(t *testing.T) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := gormleaseotel.New(gormleaseotel.WithMeterProvider(mp), gormleaseotel.WithClientGoLeaderStatus())
	require.NoError(t, err)

	ctx := context.Background()
	for _, e := range []observe.Event{
		{Kind: observe.EventCampaign, TargetID: "billing"},
		{Kind: observe.EventTermBegun, TargetID: "billing", Generation: 7, Duration: 3 * time.Second},
		{Kind: observe.EventTermEnded, TargetID: "billing", Generation: 7, TermEnd: observe.TermTakenOver},
		{Kind: observe.EventCampaign, TargetID: "billing"},
		{Kind: observe.EventTermBegun, TargetID: "billing", Generation: 9, Duration: 40 * time.Millisecond},
		{Kind: observe.EventCampaign, TargetID: "reports"},
	} {
		obs.Record(ctx, e)
	}
	text := scrape(t, reg)
	for _, line := range []string{
		"# TYPE gormlease_leader_status gauge",
		`gormlease_leader_status{gormlease_role="billing"} 1`,
		`gormlease_leader_status{gormlease_role="reports"} 0`,
		"# TYPE gormlease_leader_terms_begun_total counter",
		`gormlease_leader_terms_begun_total{gormlease_role="billing"} 2`,
		"# TYPE gormlease_leader_terms_ended_total counter",
		`gormlease_leader_terms_ended_total{gormlease_role="billing",gormlease_term_cause="taken_over"} 1`,
		"# TYPE gormlease_leader_leaderless_duration_seconds histogram",
		`gormlease_leader_leaderless_duration_seconds_bucket{gormlease_role="billing",le="0.05"} 1`,
		`gormlease_leader_leaderless_duration_seconds_bucket{gormlease_role="billing",le="5"} 2`,
		`gormlease_leader_leaderless_duration_seconds_count{gormlease_role="billing"} 2`,
		`gormlease_leader_leaderless_duration_seconds_sum{gormlease_role="billing"} 3.04`,
		"# TYPE leader_election_master_status gauge",
		`leader_election_master_status{name="billing"} 1`,
		`leader_election_master_status{name="reports"} 0`,
	} {
		assert.Regexp(t, regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(line)+`$`), text)
	}
	if t.Failed() {
		t.Log(text)
	}
}
