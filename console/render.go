package console

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"html/template"
	"net/http"
	"time"
)

// refreshEvery is how often the pages reload themselves.
const refreshEvery = 5 * time.Second

// csp is the Content-Security-Policy of every page: nothing is loaded
// from anywhere, the one style and script element carry the response's
// nonce, and forms post only to the console's own origin.
const csp = "default-src 'none'; style-src 'nonce-%[1]s'; script-src 'nonce-%[1]s'; img-src data:; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// view is what every page's template gets.
type view struct {
	Title   string
	Nonce   string
	Refresh int // milliseconds; 0 for none
	Actions bool
	Body    any
}

// render writes the page tmpl with body, status and the security headers.
// It renders into a buffer first, so that a template error becomes a 500
// and never half a page.
func (h *handler) render(w http.ResponseWriter, status int, tmpl *template.Template, title string, refresh bool, body any) {
	v := view{Title: title, Nonce: rand.Text(), Actions: h.authorize != nil, Body: body}
	if refresh {
		v.Refresh = int(refreshEvery / time.Millisecond)
	}
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, "page", v); err != nil {
		h.logger.Error("console: render page", "page", title, "err", err)
		status, buf = http.StatusInternalServerError, bytes.Buffer{}
		buf.WriteString("console: the page could not be rendered")
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Content-Security-Policy", fmt.Sprintf(csp, v.Nonce))
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "same-origin")
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// fail writes an error page with status and msg.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if wantsJSON(r) {
		h.writeJSON(w, status, jsonError{Error: msg, Status: status})
		return
	}
	h.render(w, status, errorTmpl, http.StatusText(status), false, struct{ Status, Message string }{
		fmt.Sprintf("%d %s", status, http.StatusText(status)), msg,
	})
}

// duration writes d for a person: tenths of a second under a minute,
// whole seconds under an hour, minutes above.
func duration(d time.Duration) string {
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%s%.1fs", neg, d.Seconds())
	case d < time.Hour:
		return neg + d.Round(time.Second).String()
	}
	return neg + d.Round(time.Minute).String()
}

// stamp writes t in UTC to the second.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") }

var funcs = template.FuncMap{"duration": duration, "stamp": stamp, "ended": ended, "act": operatorAct}

// layout is the frame of every page: the style, the refresh script and
// the title. A page defines "content".
const layout = `{{define "page"}}<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}} · gormlease</title>
<style nonce="{{.Nonce}}">
:root{color-scheme:light dark;--fg:#222;--bg:#fff;--muted:#6a6a6a;--link:#0645ad;--line:#ddd;--head:#f4f4f4;--pre:#f8f8f8;
--live:#d4f4d4;--expired:#fde2b8;--released:#e8e8e8;--paused:#f8c8c8;--stopping:#f4d0f0;
--note:#eef4ff;--note-line:#b8ccf0;--error:#fde8e8;--error-line:#e8a0a0;--warn:#fff4d6;--warn-line:#e8c870;--danger:#b00020;--ok:#4caf50}
@media (prefers-color-scheme:dark){:root{--fg:#e4e4e4;--bg:#16181c;--muted:#9a9a9a;--link:#8ab4f8;--line:#3a3d44;--head:#23262c;--pre:#1e2126;
--live:#1f4d2b;--expired:#5c4310;--released:#3a3d44;--paused:#6b2525;--stopping:#5a2757;
--note:#1c2a45;--note-line:#35507f;--error:#4a1d1d;--error-line:#8a3a3a;--warn:#43391a;--warn-line:#8a7430;--danger:#ff8a80;--ok:#3d8c4f}}
body{font:14px/1.4 system-ui,sans-serif;margin:1em 2em;color:var(--fg);background:var(--bg)}
h1{font-size:1.3em;margin:.2em 0 .6em;overflow-wrap:anywhere}h2{font-size:1.1em;margin-top:1.5em}
a{color:var(--link)}table{border-collapse:collapse;width:100%}
.scroll{overflow-x:auto;max-width:100%}
th,td{text-align:left;padding:.25em .6em;border-bottom:1px solid var(--line);vertical-align:top}
th{background:var(--head);font-weight:600}td.num{text-align:right}
#leases td,#leases th,#slots td,#slots th{white-space:nowrap}#leases td:last-child{white-space:normal}
#leases td:first-child{white-space:normal;overflow-wrap:anywhere;min-width:min(16em,40vw)}
.state{display:inline-block;padding:0 .5em;border-radius:.6em;font-size:.9em;color:var(--fg)}
.live{background:var(--live)}.expired{background:var(--expired)}.released{background:var(--released)}.paused{background:var(--paused)}.stopping{background:var(--stopping)}
.note,.error,.warn,.confirm{padding:.4em .8em;margin:.5em 0;border:1px solid}
.note{background:var(--note);border-color:var(--note-line)}.error{background:var(--error);border-color:var(--error-line)}
.warn,.confirm{background:var(--warn);border-color:var(--warn-line)}#concerned{width:auto}
button.danger{color:var(--danger);font-weight:600}
.counts a{text-decoration:none;color:inherit}.counts a.current b{text-decoration:underline}
.muted{color:var(--muted)}meter{width:7em}code,pre{font-family:ui-monospace,monospace;overflow-wrap:anywhere}
pre{background:var(--pre);padding:.5em;overflow:auto;max-height:30em}
form.filter,form.act{margin:.5em 0}input[name=reason]{width:24em;max-width:100%;box-sizing:border-box}form.slot{margin:0}form.slot input[name=reason]{width:10em}
form.filter label{display:inline-block;margin:0 .5em .3em 0}form.filter input,form.filter select{max-width:100%;box-sizing:border-box}
#timeline{list-style:none;padding:0;margin:.5em 0}#timeline>li{border-left:4px solid var(--line);padding:.2em .6em;margin:.5em 0;overflow-wrap:anywhere}
#timeline>li.good{border-left-color:var(--ok)}#timeline>li.bad{border-left-color:var(--error-line)}#timeline>li.open{border-left-color:var(--warn-line)}
#timeline>li.op{border-left-color:var(--note-line)}ul.during{margin:.2em 0;padding-left:1.2em}
dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.2em 1em}dt{font-weight:600}dd{margin:0;overflow-wrap:anywhere}
@media (max-width:600px){body{margin:.5em}dl{grid-template-columns:minmax(0,1fr)}dd{margin-left:1em}}
</style>
</head><body>
<p class="muted"><a href="./">gormlease leases</a>{{if not .Actions}} · read-only{{end}}</p>
{{template "content" .Body}}
{{if .Refresh}}<script nonce="{{.Nonce}}">
(function () {
  // Reload every few seconds, unless the operator is typing a reason or
  // choosing a filter; drop the notice of an action done.
  function busy() {
    var a = document.activeElement;
    if (a && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(a.tagName)) return true;
    var rs = document.querySelectorAll('input[name=reason]');
    for (var i = 0; i < rs.length; i++) {
      if (rs[i].value !== '') return true;
    }
    return false;
  }
  function tick() {
    if (busy()) { setTimeout(tick, {{.Refresh}}); return; }
    var u = new URL(location.href);
    u.searchParams.delete('done');
    u.searchParams.delete('slot');
    location.replace(u.href);
  }
  setTimeout(tick, {{.Refresh}});
})();
</script>{{end}}
</body></html>{{end}}`

// parts are the pieces that the list and the target page share: a row's
// state, its heartbeat meter and its last outcome.
const parts = `{{define "state"}}<span class="state {{.State}}">{{.State}}</span>
{{- if .MinHold}} <span class="muted">(min hold)</span>{{end}}
{{- if .Paused}} <span class="state paused" title="{{.PauseReason}}{{if .PausedBy}} (by {{.PausedBy}}){{end}}">paused</span>{{end}}
{{- if .StopRequested}} <span class="state stopping" title="{{.StopReason}}{{if .StopBy}} (by {{.StopBy}}){{end}}">stop requested</span>{{end}}{{end}}
{{define "held"}}{{if .Held}}<span title="since {{stamp .AcquiredAt}}">{{duration .HeldFor}}</span>{{else}}<span class="muted">–</span>{{end}}{{end}}
{{define "heartbeat"}}{{if .Heartbeat}}<meter min="0" max="{{.TimeoutSeconds}}" low="{{.LowSeconds}}" high="{{.HighSeconds}}" optimum="0" value="{{.AgeSeconds}}"></meter>
{{duration .Age}} / {{duration .Timeout}}{{else}}<span class="muted">{{duration .Age}} ago</span>{{end}}{{end}}
{{define "outcome"}}{{if .Failure}}<span title="failure">failed: {{.Failure}}</span>
{{- else if .SavedGen}}saved gen {{.SavedGen}}{{if .SavedAt}}, {{stamp .SavedAt}}{{end}}
{{- else}}<span class="muted">–</span>{{end}}{{end}}`

// mustPage parses content with the layout and the parts.
func mustPage(content string) *template.Template {
	t := template.Must(template.New("").Funcs(funcs).Parse(layout))
	return template.Must(template.Must(t.Parse(parts)).Parse(content))
}

var errorTmpl = mustPage(`{{define "content"}}<h1>{{.Status}}</h1><p class="error">{{.Message}}</p>{{end}}`)
