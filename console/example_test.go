package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/console"
)

// The console mounted under /ops/leases/ of the application's mux, where
// the application's own authentication would wrap it. Its authorizer lets
// the on-call operator act; everyone else may only look. The operator's
// name is recorded in the row, which the JSON view shows, and a request
// for another host name is refused.
func Example() {
	dir, _ := os.MkdirTemp("", "gormleaseconsole")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(gormlite.Open("file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(10000)"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	if err := gormlease.AutoMigrate(context.Background(), db); err != nil {
		panic(err)
	}

	ops, err := console.New(db,
		console.WithAuthorizer(func(r *http.Request, action, target string) error {
			if r.Header.Get("X-User") != "on-call" { // in an application: its session's user
				return errors.New("only the on-call operator may " + action)
			}
			return nil
		}),
		// The operator's name, recorded with each action in the row and the log.
		console.WithIdentity(func(r *http.Request) string { return r.Header.Get("X-User") }),
		// The names the console is reached by: any other Host gets 421.
		console.WithAllowedHosts("app.example"),
	)
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/leases/", http.StripPrefix("/ops/leases", ops)) // behind your login in an application

	pause := func(user string) int {
		// confirm=1: the target has no row yet, and without it the console
		// answers with a page that asks to confirm creating a paused one.
		form := url.Values{"target": {"report:user-42"}, "reason": {"deploy"}, "confirm": {"1"}}
		r := httptest.NewRequest(http.MethodPost, "http://app.example/ops/leases/pause", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", "http://app.example") // a browser sends it; a script must
		r.Header.Set("X-User", user)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w.Code
	}
	fmt.Println("a visitor pauses:", pause("visitor"))
	fmt.Println("on-call pauses:", pause("on-call"))
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://app.example/ops/leases/?state=paused&format=json", nil))
	var list struct {
		Counts struct{ Paused int }
		Rows   []struct {
			TargetID string `json:"target_id"`
			PausedBy string `json:"paused_by"`
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
		panic(err)
	}
	fmt.Printf("paused: %d, %s by %s\n", list.Counts.Paused, list.Rows[0].TargetID, list.Rows[0].PausedBy)
	w = httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://rebound.example/ops/leases/", nil))
	fmt.Println("another host:", w.Code)
	// Output:
	// a visitor pauses: 403
	// on-call pauses: 303
	// paused: 1, report:user-42 by on-call
	// another host: 421
}
