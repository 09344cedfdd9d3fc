// Package console is an operator's page for the lease table of
// github.com/gormlease/gormlease: an http.Handler that lists every lease
// row with its state, holder, generation, heartbeat age against the
// timeout the row records, and last save or failure, shows a target's row,
// slots and result row, and, when the application allows it, pauses,
// resumes, stops or releases a target.
//
// # Mounting
//
// The console is a handler that the application mounts on its own mux,
// behind its own authentication, as net/http/pprof is: the library
// serves, the application decides who may see. It serves under any path
// prefix:
//
//	h, err := console.New(db, console.WithAuthorizer(allowOps))
//	mux.Handle("/ops/leases/", requireLogin(http.StripPrefix("/ops/leases", h)))
//
// Every link and form of its pages is relative to its root, so it needs
// nothing else to know where it is mounted.
//
// # Pages
//
//   - GET / lists the rows, a page at a time (200 rows, or ?limit=N up to
//     1000), filtered by ?prefix= (the targets that start with it) and
//     ?state= (live, expired, released or paused), so that a link shares a
//     view; ?after= is the key of the last row of the previous page. The
//     heartbeat's age is shown against the timeout recorded in the row, as a
//     meter that turns yellow at half the timeout and red at four fifths.
//   - GET /target?id=TARGET shows the target's row, its slots' rows
//     (gormlease.WithSlots) and its result row (gormlease.SaveJSON).
//
// Both reload themselves every few seconds, unless the operator is typing.
//
// # Actions
//
// POST /pause, /resume, /stop and /release, with the form fields target
// and reason, pause the target (admin.Operator.Pause), resume it, ask its
// holder to stop (admin.Operator.RequestStop), or end its lease by force
// (admin.Operator.ForceRelease). For a target with slots (gormlease.WithSlots),
// each applies to every slot. Each is refused with 403, writing nothing,
// unless the request comes from the console's own origin, by its
// Sec-Fetch-Site or Origin header (a request with neither is refused too,
// so a script sends one of them: curl -H 'Origin: https://ops.example'),
// and then only when the authorizer that WithAuthorizer set allows it;
// without one the console is read-only. A reason is required, except to
// resume. Done, an action answers 303 See Other to the target's page;
// an unknown or ended lease gets 409, bad input 400. Each action, done or
// refused, is logged through log/slog with its target and reason
// (WithLogger).
//
// Stop and release also take the form field slot, a slot's number from 1
// to 100: they then act on that slot of the target only
// (admin.Operator.RequestStopSlot, ForceReleaseSlot), and the other slots'
// holders keep their leases. The target page offers both on each slot
// that is not released. A slot that is not such a number, or one given
// to pause or resume, is a 400 that writes nothing and asks no
// authorizer. The authorizer is asked with the target's ID, as for the
// whole target; it reads the slot, when it cares, with
// r.FormValue("slot"), and the log records it (slot=N).
//
// # Safety of the pages
//
// The pages are html/template output, with no external assets, no build
// step and no JavaScript framework: one style element and one small
// script, which carry a per-response nonce named in the
// Content-Security-Policy sent with every page (default-src 'none'). Every
// target ID, holder, reason and result is escaped.
//
// # Modules
//
// The console is a module of its own, so that the core module's users do
// not get its dependencies. Its browser tests, which drive headless
// Chromium with github.com/chromedp/chromedp, are another module,
// console/browsertest, so that chromedp is in neither the core module's
// graph nor the graph of an application that imports the console. The
// gormlease command (cmd/gormlease), whose serve command serves the
// console, is a module of its own too: in the core module it would make
// the core require the console, which requires the core, a cycle that
// would also ask every user of the core for a console version.
package console
