//go:build gormlease_mutation_do_first_read

package gormlease

// doFirstReadRule is dropped in this build: the history checker's mutation
// of Do (see mutation.go).
const doFirstReadRule = false
