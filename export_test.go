package gormlease

// PostgresSchema exposes the PostgreSQL DDL to the black-box tests.
var PostgresSchema = postgresSchema
