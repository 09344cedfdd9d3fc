//go:build !race

package history

// raceEnabled says that the tests run with the race detector, and so
// should the workers built apart (see workerBinary).
const raceEnabled = false
