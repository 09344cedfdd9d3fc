package dsn_test

import (
	"os"
	"path/filepath"
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
		"root:pw@tcp(127.0.0.1:3306)/test":                                    "root:***@tcp(127.0.0.1:3306)/test",
		"root@tcp(127.0.0.1:3306)/test":                                       "root@tcp(127.0.0.1:3306)/test",
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

// Parse takes every form that the docs name, and says which database each
// names, with the DSN its driver takes.
func TestParse_EveryForm(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "app.db")
	require.NoError(t, os.WriteFile(existing, nil, 0o600))
	cases := []struct {
		name, in string
		kind     dsn.Kind
		driver   string
	}{
		{"PostgresURL", "postgres://app@db:5432/jobs?sslmode=disable", dsn.KindPostgres, "postgres://app@db:5432/jobs?sslmode=disable"},
		{"PostgresqlURL", "postgresql://app@db/jobs", dsn.KindPostgres, "postgresql://app@db/jobs"},
		{"KeywordForm", "host=127.0.0.1 user=postgres dbname=app", dsn.KindPostgres, "host=127.0.0.1 user=postgres dbname=app"},
		{"KeywordFormMultiHost", "host=db1,db2 port=5432,5432 user=app dbname=app target_session_attrs=read-write",
			dsn.KindPostgres, "host=db1,db2 port=5432,5432 user=app dbname=app target_session_attrs=read-write"},
		{"MySQLURL", "mysql://root:pw@tcp(127.0.0.1:3306)/app", dsn.KindMySQL,
			"root:pw@tcp(127.0.0.1:3306)/app?parseTime=true"},
		{"MySQLDriverForm", "root@tcp(127.0.0.1:3306)/app", dsn.KindMySQL, "root@tcp(127.0.0.1:3306)/app?parseTime=true"},
		{"MySQLDriverFormNoDatabase", "root@tcp(127.0.0.1:3306)/", dsn.KindMySQL, "root@tcp(127.0.0.1:3306)/?parseTime=true"},
		{"SQLitePrefix", "sqlite:" + existing, dsn.KindSQLite, "file:" + existing + "?" + dsn.SQLitePragmas},
		{"SQLiteURLPrefix", "sqlite://" + existing, dsn.KindSQLite, "file:" + existing + "?" + dsn.SQLitePragmas},
		{"SQLitePrefixNewFile", "sqlite:new.db", dsn.KindSQLite, "file:new.db?" + dsn.SQLitePragmas},
		{"SQLitePrefixWithSettings", "sqlite:new.db?_pragma=busy_timeout(5000)", dsn.KindSQLite, "file:new.db?_pragma=busy_timeout(5000)"},
		{"FilePrefix", "file:app.db?_pragma=busy_timeout(10000)", dsn.KindSQLite, "file:app.db?_pragma=busy_timeout(10000)"},
		{"ExistingPath", existing, dsn.KindSQLite, "file:" + existing + "?" + dsn.SQLitePragmas},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := dsn.Parse(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.kind, p.Kind)
			assert.Equal(t, tc.driver, p.Driver)
			assert.Equal(t, tc.kind == dsn.KindMySQL, p.MySQL != nil)
			d, kind, err := dsn.Open(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.kind, kind)
			assert.Equal(t, string(tc.kind), d.Name())
		})
	}
}

// A DSN of no known form is an error that lists the forms, and no file is
// created for it: a bare path is SQLite only when the file exists.
func TestParse_UnrecognizedCreatesNothing(t *testing.T) {
	dir := t.TempDir()
	for _, in := range []string{
		"",
		filepath.Join(dir, "missing.db"),
		"app.db",
		"postgress://app@db/jobs",
		"redis://localhost:6379",
		"root@localhost/app",
		dir, // a directory, not a file
		"sqlite:",
	} {
		p, err := dsn.Parse(in)
		require.ErrorIs(t, err, dsn.ErrUnrecognized, in)
		assert.Empty(t, p.Kind, in)
		if in != "sqlite:" {
			assert.Contains(t, err.Error(), dsn.Forms, in)
		}
		_, _, err = dsn.Open(in)
		require.ErrorIs(t, err, dsn.ErrUnrecognized, in)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "a file was created")
	_, err = os.Stat("app.db")
	assert.True(t, os.IsNotExist(err), "app.db was created")
}

// A DSN of a known form that its driver cannot read is an error naming the
// database, without the password.
func TestParse_BadDSNOfKnownForm(t *testing.T) {
	_, err := dsn.Parse("mysql://root:secret@tcp(127.0.0.1:3306")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad MySQL DSN")
	assert.NotContains(t, err.Error(), "secret")
	_, err = dsn.Parse("postgres://app:secret@db:notaport/jobs")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad PostgreSQL DSN")
	assert.NotContains(t, err.Error(), "secret")
}
