package postgres

// Literal and RefusesQueries expose the simple-protocol literal and the
// recogniser of a driver's refusal to the black-box tests.
var (
	Literal        = literal
	RefusesQueries = refusesQueries
)
