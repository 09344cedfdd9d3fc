package main

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCommand_ServeEndsOnSIGTERM runs the built command's serve, as
// systemd or docker stop would end it: SIGTERM ends it as an interrupt
// does, through its graceful shutdown, with exit 0.
func TestCommand_ServeEndsOnSIGTERM(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gormlease")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "leases.db")
	out, err = exec.Command(bin, "migrate", "-dsn", dsn).CombinedOutput()
	require.NoError(t, err, "%s", out)

	serve := exec.Command(bin, "serve", "-addr", "127.0.0.1:0", "-dsn", dsn)
	stdout, err := serve.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	serve.Stderr = &stderr
	require.NoError(t, serve.Start())
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "serve wrote nothing; stderr: %s", stderr.String())
	require.Contains(t, lines.Text(), "serving the console on")

	require.NoError(t, serve.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- serve.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "serve's exit on SIGTERM; stderr: %s", stderr.String())
	case <-time.After(30 * time.Second):
		_ = serve.Process.Kill()
		t.Fatal("serve did not end within 30 s of SIGTERM")
	}
}
