// Package browsertest holds the console's tests in a real browser:
// headless Chromium, driven by github.com/chromedp/chromedp. It is a
// module of its own so that chromedp is in neither the core module's
// graph nor the console's, which applications import. It has no code
// but its tests.
package browsertest
