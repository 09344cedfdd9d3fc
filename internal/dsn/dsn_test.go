package dsn_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/dsn"
)

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://app:s3cr:et@db:5432/jobs":                                 "postgres://app:***@db:5432/jobs",
		"postgres://app@h1:5432,h2:5433/jobs?target_session_attrs=read-write": "postgres://app@h1:5432,h2:5433/jobs?target_session_attrs=read-write",
		"mysql://root:pw@tcp(127.0.0.1:3306)/test":                            "mysql://root:***@tcp(127.0.0.1:3306)/test",
		"mysql://root@tcp(127.0.0.1:3306)/test":                               "mysql://root@tcp(127.0.0.1:3306)/test",
		"host=db user=app password=secret dbname=jobs":                        "host=db user=app password=*** dbname=jobs",
		"host=db password='sec ret' dbname=jobs":                              "host=db password=*** dbname=jobs",
		"file:/tmp/jobs.db?_pragma=busy_timeout(10000)":                       "file:/tmp/jobs.db?_pragma=busy_timeout(10000)",
	} {
		assert.Equal(t, want, dsn.Redact(in), in)
	}
}

func TestMySQL(t *testing.T) {
	cfg, err := dsn.MySQL("mysql://root:pw@tcp(127.0.0.1:3306)/test")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:3306", cfg.Addr)
	assert.Equal(t, "test", cfg.DBName)
	assert.True(t, cfg.ParseTime)
	assert.Equal(t, time.UTC, cfg.Loc)

	_, err = dsn.MySQL("mysql://root@tcp(127.0.0.1:3306")
	assert.Error(t, err)
}
