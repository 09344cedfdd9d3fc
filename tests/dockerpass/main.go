// Command dockerpass runs gormlease's tests against PostgreSQL 15 and
// MariaDB 10.11 in Docker containers: the docker pass of .ci/run.
//
// Usage, from the repository's root (from tests/, go run ./dockerpass);
// it finds the root module's directory itself:
//
//	go run -C tests ./dockerpass [-timeout 30m] [-run regexp] [-skip regexp]
//	go run -C tests ./dockerpass [-timeout 30m] command [arg...]
//
// It starts a postgres:15 and a mariadb:10.11 container, each in the host's
// network on a free port of 127.0.0.1 (see docker.go), and waits until both
// answer. It then runs, with GORMLEASE_TEST_POSTGRES_DSN and
// GORMLEASE_TEST_MYSQL_DSN naming the two servers (internal/testdb takes a
// DSN from the environment before anything else) and GORMLEASE_TEST_DOCKER
// set (a database test that cannot reach its server fails rather than
// skips, and the TestDocker_ tests of this command run), the tests of the
// root module and then those of the tests module:
//
//	go test -race -count=1 -timeout 30m [-run regexp] [-skip regexp] ./...
//
// in each module's directory; or, when a command is given, that command in
// the root module's directory. It removes the containers at the end, and
// exits with the status of the first run that failed, or 1 when a
// container did not start or an interrupt (SIGINT, SIGTERM) ended the runs.
//
// All the test processes share the two servers, as they share the local
// servers without dockerpass: each works in a schema (PostgreSQL) or
// database (MySQL) of its own, which internal/testdb makes at its start and
// drops at its end, so test packages running at once never see each
// other's rows.
//
// The images are never pulled: scripts/docker-images.sh builds both where
// no registry is reachable, and the official ones (docker pull) work too.
// DOCKER_HOST names the engine, as for the docker command.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"

	"github.com/gormlease/gormlease/internal/testdb"
)

// rootModule is the module path of gormlease, whose directory dockerpass
// looks for.
const rootModule = "github.com/gormlease/gormlease"

// dockerEnv is set, to 1, for the tests that dockerpass runs: internal/testdb
// then fails a test that cannot reach its server rather than skipping it,
// and the TestDocker_ tests run (they skip without it).
const dockerEnv = "GORMLEASE_TEST_DOCKER"

func main() {
	os.Exit(run())
}

func run() int {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: dockerpass [flags] [command [arg...]]

Runs the tests of gormlease's root module and of its tests module (or the
command, in the root module's directory) against a postgres:15 and a
mariadb:10.11 container. Flags:
`)
		flag.PrintDefaults()
	}
	timeout := flag.Duration("timeout", 30*time.Minute,
		"go test's -timeout in each module; the containers are killed after twice this and a minute")
	runRE := flag.String("run", "", "go test's -run, for the tests of both modules")
	skipRE := flag.String("skip", "", "go test's -skip, for the tests of both modules")
	flag.Parse()

	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dockerpass:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	lifetime := 2**timeout + time.Minute
	var containers []*container
	defer func() {
		for _, c := range containers {
			if err := c.stop(); err != nil {
				fmt.Fprintf(os.Stderr, "dockerpass: remove the container %.12s of %s: %v\n", c.id, c.image, err)
			}
		}
	}()
	for _, spec := range []containerSpec{postgresSpec(lifetime), mariadbSpec(lifetime)} {
		c, err := startContainer(spec)
		if err != nil {
			fmt.Fprintln(os.Stderr, "dockerpass:", err)
			return 1
		}
		containers = append(containers, c)
	}
	env := append(withoutTestEnv(os.Environ()),
		"GORMLEASE_TEST_POSTGRES_DSN="+postgresDSN(containers[0].port),
		"GORMLEASE_TEST_MYSQL_DSN="+mariadbConfig(containers[1].port).FormatDSN(),
		dockerEnv+"=1")

	type step struct {
		dir  string
		args []string
	}
	var steps []step
	if flag.NArg() > 0 {
		steps = []step{{root, flag.Args()}}
	} else {
		args := []string{"go", "test", "-race", "-count=1", "-timeout", timeout.String()}
		if *runRE != "" {
			args = append(args, "-run", *runRE)
		}
		if *skipRE != "" {
			args = append(args, "-skip", *skipRE)
		}
		args = append(args, "./...")
		steps = []step{{root, args}, {filepath.Join(root, "tests"), args}}
	}
	status := 0
	for _, s := range steps {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(os.Stderr, "dockerpass: in %s: %s\n", s.dir, strings.Join(s.args, " "))
		if code := runIn(ctx, s.dir, env, s.args); code != 0 && status == 0 {
			status = code
		}
	}
	if ctx.Err() != nil && status == 0 {
		status = 1
	}
	return status
}

// runIn runs the command args in dir with env, its output on dockerpass's
// own, and returns its exit status (1 when it could not start). An
// interrupt (ctx's end) reaches it as SIGINT.
func runIn(ctx context.Context, dir string, env, args []string) int {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		return exit.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "dockerpass: %s: %v\n", args[0], err)
		return 1
	}
}

// moduleRoot returns the directory of gormlease's root module: the working
// directory or the nearest of its parents whose go.mod declares it.
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if modulePath(filepath.Join(dir, "go.mod")) == rootModule {
			return dir, nil
		}
		if dir == filepath.Dir(dir) {
			return "", fmt.Errorf("no go.mod of module %s in %s or above it", rootModule, wd)
		}
	}
}

// modulePath returns the module path that the go.mod file at path
// declares, or "" when there is none.
func modulePath(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// withoutTestEnv is env without the variables by which internal/testdb
// finds its servers, which dockerpass sets.
func withoutTestEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "GORMLEASE_TEST_POSTGRES_DSN", "GORMLEASE_TEST_DSN", "GORMLEASE_TEST_MYSQL_DSN", dockerEnv:
			continue
		}
		out = append(out, kv)
	}
	return out
}

// postgresSpec is PostgreSQL 15, listening on its port (PGPORT) of
// 127.0.0.1 only, with the database test, trusting every connection.
func postgresSpec(lifetime time.Duration) containerSpec {
	return containerSpec{
		image: "postgres:15",
		env: func(port int) []string {
			return []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=test", "PGPORT=" + strconv.Itoa(port)}
		},
		cmd:      func(int) []string { return []string{"postgres", "-c", "listen_addresses=127.0.0.1"} },
		ready:    func(port int) error { return testdb.Ping("pgx", postgresDSN(port)) },
		maxWait:  time.Minute,
		lifetime: lifetime,
	}
}

// postgresDSN is the DSN of the database test of postgresSpec's server on
// port, as user postgres.
func postgresDSN(port int) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=test sslmode=disable connect_timeout=5", port)
}

// mariadbSpec is MariaDB 10.11, listening on its port of 127.0.0.1 only,
// with the database test, and root without a password.
func mariadbSpec(lifetime time.Duration) containerSpec {
	return containerSpec{
		image: "mariadb:10.11",
		env:   func(int) []string { return []string{"MARIADB_ALLOW_EMPTY_ROOT_PASSWORD=1", "MARIADB_DATABASE=test"} },
		cmd: func(port int) []string {
			return []string{"--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1"}
		},
		ready:    func(port int) error { return testdb.Ping("mysql", mariadbConfig(port).FormatDSN()) },
		maxWait:  2 * time.Minute,
		lifetime: lifetime,
	}
}

// mariadbConfig is a connection as root, outside any database, to
// mariadbSpec's server on port: the form of GORMLEASE_TEST_MYSQL_DSN.
func mariadbConfig(port int) *mysqldriver.Config {
	cfg := mysqldriver.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.Timeout = "root", "tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second
	return cfg
}
