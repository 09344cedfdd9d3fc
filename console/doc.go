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
//     1000), with the counts of the rows in each state (live, expired,
//     released, paused, stop requested) and a banner when some are
//     expired. ?prefix= keeps the targets that start with it, ?state= one
//     state (live, expired, released or paused), ?holder= one holder's
//     rows (its exact name), and ?order= sorts them: by target (the
//     default), age (the longest silent first), held (the longest held
//     first) or expiry (the soonest to expire first, the expired before).
//     The database filters and sorts (admin.Operator.List), so every page
//     costs about the same however many rows there are; ?after= is the
//     cursor of the previous page's last row, which the next page's link
//     carries. A link shares a view. The heartbeat's age is shown against
//     the timeout recorded in the row, as a meter that turns yellow at
//     half the timeout and red at four fifths, and a live lease's "held
//     for" counts from its acquisition.
//   - GET /target?id=TARGET shows the target's row (held since when, who
//     paused it or asked it to stop), its slots' rows (gormlease.WithSlots)
//     and its result row (gormlease.SaveJSON). Every legal target ID has a
//     page, up to 255 bytes; one that no target can have is a 400 that
//     says why.
//   - The target page ends with the row's history (admin.Operator.History),
//     when the lease table keeps one: a timeline, newest first, with an
//     entry per generation (its holder, how it began: new, released,
//     expired from generation g or seized; how it ended: saved, failed
//     with the failure's text, released by force by whom...; and
//     how long it was held), the operator's actions while it was held
//     (a stop request, a pause) in it, and those between generations
//     (paused with who and why, resumed with who) as entries of their own.
//     A page shows at most 100 events (it reads 101, to know whether older
//     ones exist), however long the history; it ends at the
//     oldest generation that begins on it, and its "Older events" link
//     carries ?before=, the position where the older page starts.
//     ?history=N shows slot N's history instead of the target's own
//     row's. A table that keeps no history says so in one line, with how
//     to turn it on (gormlease.AutoMigrate with gormlease.WithHistory(),
//     or gormlease migrate -history); an error reading the history is
//     shown in its section, and the rest of the page is not affected.
//   - ?format=json on either answers the same data as JSON
//     (application/json): the list's rows, counts and next cursor (pass it
//     as ?after=), or the target's row, slots, result and history (its
//     events, newest first, as the timeline shows them, and older: the
//     ?before= of the older page). Times are RFC
//     3339 in UTC, durations in milliseconds, and text is as it is stored
//     (no HTML escaping). Errors are JSON too: {"error": ..., "status": ...}.
//
// Both pages reload themselves every few seconds, unless the operator is
// typing. They follow the browser's dark mode (prefers-color-scheme), and
// fit a 400 px screen: a table wider than the screen scrolls in its own
// box.
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
// bad input gets 400. Each action, done or refused, is logged through
// log/slog with its target and reason, and the operator's name
// (WithIdentity), which a pause, a stop and a release also record in the
// rows (a resume records its own in place of the pause's).
//
// An action must match the target's state when it is posted: a pause of
// a paused target, a resume of one not paused, a stop or release of a
// target with no live lease (released, or never acquired) is a 409 that
// writes nothing; the target's page offers only the buttons that match.
// Stop and release ask first: posted without the form field confirm=1
// they answer a page that names the target and each lease concerned (its
// holder and generation), and write nothing; its button posts the same
// form with confirm=1 and, when it names one lease (not every slot of a
// semaphore), its generation: if another run has taken that lease since,
// the action is a 409 that writes nothing. A pause of a
// target that has no row asks first too, saying that it creates a paused
// row. A script that means it posts confirm=1 at once.
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
// # Hosts
//
// WithAllowedHosts names the hosts the console answers for: a request for
// another Host gets 421 and nothing is read or written. It stops DNS
// rebinding, in which a page of another site whose name an attacker
// re-resolved to the console's address is same-origin to the browser.
// Without it, every Host is served.
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
