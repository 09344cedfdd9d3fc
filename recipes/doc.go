// Package recipes holds the code of docs/recipes.md: small adapters that
// put gormlease in front of the work of other libraries (River, asynq,
// robfig/cron), a startup migration run once across pods, and an HTTP
// handler whose tabs share one report. Each is short enough to copy into
// an application, and each is tested against the real servers.
//
// It is a module of its own, github.com/gormlease/gormlease/recipes, so
// that these libraries stay out of gormlease's own module graph.
package recipes
