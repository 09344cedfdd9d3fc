//go:build !gormlease_mutation_do_first_read

package gormlease

// doFirstReadRule is Do's rule that a result saved after the call began is
// shared, however late the call's first read of the row (see savedSince).
// The history checker builds its workers with the build tag
// gormlease_mutation_do_first_read, which drops it, and must then find
// Do running a job a second time.
const doFirstReadRule = true
