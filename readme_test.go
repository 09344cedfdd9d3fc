package gormlease_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmePrelude declares what the README's Go snippets take as given: the
// handler's variables, the application's Report type and its slow calls.
const readmePrelude = `
type Report struct{ ID int64 }

func makeReport(context.Context, string, int64) (*Report, error) { return &Report{}, nil }

type reportAPI struct{}

func (reportAPI) MakeReport(context.Context, string) (Report, error) { return Report{}, nil }

var api reportAPI
`

// readmeImports are the packages that the snippets use without importing
// them, as the README's prose says they run in a handler.
var readmeImports = []string{"context", "errors", "net/http", "strconv", "gorm.io/gorm",
	"github.com/gormlease/gormlease", "github.com/ncruces/go-sqlite3/gormlite"}

// The Go snippets of README.md compile against the package as it is: each
// becomes the body of a handler (with ctx, w, req, id and, unless
// it makes one, a Runner), and go vet checks them. A renamed error, type
// or method, or a changed signature, fails here rather than in a reader's
// editor.
func TestREADME_GoSnippetsCompile(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllSubmatch(readme, -1)
	if len(blocks) < 2 {
		t.Fatalf("README.md has %d Go snippets, want at least 2 (quickstart and Do)", len(blocks))
	}
	var src bytes.Buffer
	src.WriteString("package main\n\nimport (\n")
	for _, p := range readmeImports {
		fmt.Fprintf(&src, "\t%q\n", p)
	}
	src.WriteString(")\n" + readmePrelude)
	imports := regexp.MustCompile(`(?s)^import \((.*?)\n\)\n`)
	declared := regexp.MustCompile(`(?m)^(\w+)(?:, (\w+))?(?:, (\w+))? :?= `)
	for i, b := range blocks {
		body := string(b[1])
		body = imports.ReplaceAllString(body, "") // the file imports them
		fmt.Fprintf(&src, "\nfunc snippet%d(ctx context.Context, w http.ResponseWriter, req *http.Request, id string) error {\n", i+1)
		if !strings.Contains(body, "runner, err :=") {
			src.WriteString("\tvar runner *gormlease.Runner[Report]\n")
		}
		src.WriteString(body)
		// A snippet ends at its last statement: what it declares is for
		// the reader's code that would follow.
		for _, m := range declared.FindAllStringSubmatch(body, -1) {
			for _, name := range m[1:] {
				if name != "" && name != "err" {
					fmt.Fprintf(&src, "\t_ = %s\n", name)
				}
			}
		}
		src.WriteString("\treturn nil\n}\n")
	}
	src.WriteString("\nfunc main() {}\n")
	// The program lives in the module, so that it builds against this
	// checkout and the module's own requirements.
	dir, err := os.MkdirTemp(".", "readme-snippets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	file := filepath.Join(dir, "main.go")
	if err := os.WriteFile(file, src.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "vet", "./"+dir).CombinedOutput()
	if err != nil {
		t.Fatalf("README.md's Go snippets do not compile: %v\n%s\nthe program:\n%s", err, out, numbered(src.String()))
	}
}

// numbered prefixes each line of s with its number, for a failure's
// message.
func numbered(s string) string {
	lines := strings.Split(s, "\n")
	for i := range lines {
		lines[i] = fmt.Sprintf("%4d  %s", i+1, lines[i])
	}
	return strings.Join(lines, "\n")
}
