package console

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/gormlease/gormlease/admin"
)

// The JSON view: ?format=json on the list and on a target's page answers
// the same rows as the page, as JSON, for scripts and dashboards.

// wantsJSON reports whether r asks for the JSON view.
func wantsJSON(r *http.Request) bool { return r.URL.Query().Get("format") == "json" }

// checkFormat says what is wrong with r's ?format, or "".
func checkFormat(r *http.Request) string {
	switch f := r.URL.Query().Get("format"); f {
	case "", "html", "json":
		return ""
	default:
		return "format " + strconv.Quote(f) + ": give json, or html (the default)"
	}
}

// jsonRow is a lease row in the JSON view. Durations are in
// milliseconds; times are RFC 3339, in UTC.
type jsonRow struct {
	Key           string `json:"key"`
	TargetID      string `json:"target_id"`
	Slot          int    `json:"slot,omitempty"`
	State         string `json:"state"`
	MinHold       bool   `json:"min_hold,omitempty"`
	Paused        bool   `json:"paused"`
	PauseReason   string `json:"pause_reason,omitempty"`
	PausedBy      string `json:"paused_by,omitempty"`
	StopRequested bool   `json:"stop_requested"`
	StopReason    string `json:"stop_reason,omitempty"`
	StopBy        string `json:"stop_by,omitempty"`
	Holder        string `json:"holder"`
	Generation    int64  `json:"generation"`
	LeaseToken    string `json:"lease_token"`
	AgeMS         int64  `json:"age_ms"`
	// TimeoutMS is null when the row records no timeout; ExpiresInMS is
	// null for a released row, and negative once the lease has expired.
	TimeoutMS   *int64 `json:"timeout_ms"`
	ExpiresInMS *int64 `json:"expires_in_ms"`
	// AcquiredAt is when the current generation was acquired, null when
	// the row does not record it; HeldForMS is the time since, null for a
	// released row or when AcquiredAt is.
	AcquiredAt      *time.Time `json:"acquired_at"`
	HeldForMS       *int64     `json:"held_for_ms"`
	UpdatedAt       time.Time  `json:"updated_at"`
	ReleasedAt      *time.Time `json:"released_at"`
	SavedGeneration *int64     `json:"saved_generation"`
	SavedAt         *time.Time `json:"saved_at"`
	Failure         *string    `json:"failure"`
}

// ms is d in whole milliseconds.
func ms(d time.Duration) int64 { return d.Milliseconds() }

// utc is t in UTC, or nil.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// json is r as the JSON view shows it.
func (r row) json() jsonRow {
	j := jsonRow{
		Key: r.Key, TargetID: r.TargetID, Slot: r.Slot, State: r.State, MinHold: r.MinHold,
		Paused: r.Paused, PauseReason: r.PauseReason, PausedBy: r.PausedBy,
		StopRequested: r.StopRequested, StopReason: r.StopReason, StopBy: r.StopBy,
		AcquiredAt: utc(r.AcquiredAt),
		Holder:     r.Holder, Generation: r.Generation, LeaseToken: r.Token, AgeMS: ms(r.Age),
		UpdatedAt: r.UpdatedAt.UTC(), ReleasedAt: utc(r.ReleasedAt),
		SavedGeneration: r.SavedGen, SavedAt: utc(r.SavedAt), Failure: r.Failure,
	}
	if r.HasTimeout {
		t := ms(r.Timeout)
		j.TimeoutMS = &t
	}
	if r.State != "released" {
		e := ms(r.ExpiresIn)
		j.ExpiresInMS = &e
	}
	if r.Held() {
		held := ms(r.HeldFor)
		j.HeldForMS = &held
	}
	return j
}

// jsonRows are rows as the JSON view shows them: never null.
func jsonRows(rows []row) []jsonRow {
	out := make([]jsonRow, len(rows))
	for i, r := range rows {
		out[i] = r.json()
	}
	return out
}

// writeJSON writes v as JSON with status, escaping nothing for HTML (the
// view is never HTML), with the headers of the pages that apply.
func (h *handler) writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		h.logger.Error("console: write JSON", "err", err)
		status, buf = http.StatusInternalServerError, bytes.Buffer{}
		buf.WriteString(`{"error": "the view could not be written as JSON", "status": 500}` + "\n")
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// jsonError is an error in the JSON view.
type jsonError struct {
	Error  string `json:"error"`
	Status int    `json:"status"`
}

// listJSON is the list in the JSON view.
type listJSON struct {
	Prefix string `json:"prefix"`
	State  string `json:"state"`
	Order  string `json:"order"`
	Holder string `json:"holder"`
	Limit  int    `json:"limit"`
	// Counts are the rows under the prefix in each state (whatever the
	// other filters).
	Counts jsonCounts `json:"counts"`
	Rows   []jsonRow  `json:"rows"`
	// Next is the value of ?after= for the next page; "" on the last.
	Next string `json:"next"`
}

// targetJSON is a target's page in the JSON view.
type targetJSON struct {
	TargetID string    `json:"target_id"`
	Row      *jsonRow  `json:"row"`
	Slots    []jsonRow `json:"slots"`
	// HeldSlots is the number of live slots.
	HeldSlots int         `json:"held_slots"`
	Result    *resultJSON `json:"result"`
	// History is the page's events of the target's own row, or of the
	// slot that ?history= names.
	History historyJSON `json:"history"`
}

// historyJSON is the target page's history in the JSON view: the same
// events as the page's timeline, newest first.
type historyJSON struct {
	// Kept is false when the lease table keeps no history; Error is the
	// history's read error, absent when there is none.
	Kept  bool   `json:"kept"`
	Error string `json:"error,omitempty"`
	// Slot is the slot whose history it is, absent for the target's own
	// row.
	Slot   int         `json:"slot,omitempty"`
	Events []eventJSON `json:"events"`
	// Older is the value of ?before= for the older events, absent when
	// there are none.
	Older int64 `json:"older,omitempty"`
}

// eventJSON is an admin.Event in the JSON view. FromGeneration,
// AcquiredAt and HeldForMS are absent when the event has none (see
// admin.Event), and so are the empty texts.
type eventJSON struct {
	Key            string     `json:"key"`
	Seq            int64      `json:"seq"`
	At             time.Time  `json:"at"`
	Kind           string     `json:"kind"`
	Generation     int64      `json:"generation"`
	Holder         string     `json:"holder"`
	How            string     `json:"how,omitempty"`
	FromGeneration int64      `json:"from_generation,omitempty"`
	AcquiredAt     *time.Time `json:"acquired_at,omitempty"`
	HeldForMS      *int64     `json:"held_for_ms,omitempty"`
	Operator       string     `json:"operator,omitempty"`
	Detail         string     `json:"detail,omitempty"`
}

// json is t as the JSON view shows it.
func (t timeline) json() historyJSON {
	j := historyJSON{Kept: t.Kept, Error: t.Err, Slot: t.Slot, Older: t.Older, Events: make([]eventJSON, len(t.Events))}
	for i, e := range t.Events {
		j.Events[i] = eventJSON{Key: e.Key, Seq: e.Seq, At: e.At.UTC(), Kind: string(e.Kind), Generation: e.Generation,
			Holder: e.Holder, How: e.How, FromGeneration: e.FromGeneration, AcquiredAt: utc(e.AcquiredAt),
			Operator: e.Operator, Detail: e.Detail}
		if e.Kind == admin.EventEnded && e.AcquiredAt != nil {
			held := ms(e.HeldFor())
			j.Events[i].HeldForMS = &held
		}
	}
	return j
}

// resultJSON is a target's result row in the JSON view.
type resultJSON struct {
	Generation int64     `json:"generation"`
	UpdatedAt  time.Time `json:"updated_at"`
	Size       int       `json:"size"`
	// Data is the saved JSON, when it is JSON of at most 64 KiB; else
	// absent, and Truncated or NotJSON says why.
	Data      json.RawMessage `json:"data,omitempty"`
	Truncated bool            `json:"truncated,omitempty"`
	NotJSON   bool            `json:"not_json,omitempty"`
}

// json is v as the JSON view shows it.
func (v targetView) json() targetJSON {
	j := targetJSON{TargetID: v.TargetID, Slots: jsonRows(v.Slots), HeldSlots: v.Held, History: v.History.json()}
	if v.Row != nil {
		r := v.Row.json()
		j.Row = &r
	}
	if res := v.Result; res != nil {
		j.Result = &resultJSON{Generation: res.Generation, UpdatedAt: res.UpdatedAt.UTC(), Size: res.Size, Truncated: res.Truncated}
		switch {
		case res.Truncated:
		case json.Valid(res.raw):
			j.Result.Data = res.raw
		default:
			j.Result.NotJSON = true
		}
	}
	return j
}

// jsonCounts are admin.Counts in the JSON view.
type jsonCounts struct {
	Total         int64 `json:"total"`
	Live          int64 `json:"live"`
	Expired       int64 `json:"expired"`
	Released      int64 `json:"released"`
	Paused        int64 `json:"paused"`
	StopRequested int64 `json:"stop_requested"`
}

// countsJSON is c in the JSON view.
func countsJSON(c admin.Counts) jsonCounts {
	return jsonCounts{Total: c.Total, Live: c.Live, Expired: c.Expired, Released: c.Released, Paused: c.Paused, StopRequested: c.StopRequested}
}
