// Package browsertest holds the console's tests in a real browser:
// headless Chromium, driven by github.com/chromedp/chromedp. It is a
// module of its own so that chromedp is in neither the core module's
// graph nor the console's, which applications import. It has no code
// but its tests.
//
// The tests save screenshots of the pages they check in their artifact
// directory (go test -artifacts). With GORMLEASE_UPDATE_DOCS=1 they also
// write the console's picture in docs/operating.md, docs/console-list.png,
// from the list they show on PostgreSQL:
//
//	cd console/browsertest && GORMLEASE_UPDATE_DOCS=1 go test -run ListAndAct .
package browsertest
