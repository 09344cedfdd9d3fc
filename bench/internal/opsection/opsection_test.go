package opsection

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPut(t *testing.T) {
	block := Wrap("## Operations\n\nnew figures\n")
	for _, tc := range []struct{ name, doc, want string }{
		{"Empty", "", block},
		{"NoMarkers", "# Performance\n\ntext\n", "# Performance\n\ntext\n\n" + block},
		{"NoFinalNewline", "# Performance", "# Performance\n\n" + block},
		{"ReplacesBetweenMarkers",
			"# P\n\n" + Begin + "\nold figures\n" + End + "\n\n## After\n",
			"# P\n\n" + block + "\n## After\n"},
		{"ReplacesAtEnd", "# P\n\n" + Wrap("old"), "# P\n\n" + block},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Put(tc.doc, block)
			if err != nil || got != tc.want {
				t.Fatalf("Put = %q, %v; want %q", got, err, tc.want)
			}
			found, ok, err := Find(got)
			if !ok || err != nil || found != block {
				t.Fatalf("Find after Put = %q, %v, %v; want %q", found, ok, err, block)
			}
		})
	}
}

func TestMalformedMarkersAreErrors(t *testing.T) {
	for _, doc := range []string{
		Begin + "\nno end\n",
		"no begin\n" + End + "\n",
		End + "\n" + Begin + "\n",
		Wrap("one") + Wrap("two"),
	} {
		if _, err := Put(doc, Wrap("x")); err == nil {
			t.Errorf("Put(%q) succeeded", doc)
		}
		if _, err := Carry(doc, "fresh\n"); err == nil {
			t.Errorf("Carry(%q) succeeded", doc)
		}
	}
}

func TestCarry(t *testing.T) {
	old := "# Old report\n\n" + Wrap("ops figures") + "\n## Old tail\n"
	got, err := Carry(old, "# New report\n")
	if want := "# New report\n\n" + Wrap("ops figures"); err != nil || got != want {
		t.Fatalf("Carry = %q, %v; want %q", got, err, want)
	}
	if got, err := Carry("# Old report\n", "# New report\n"); err != nil || got != "# New report\n" {
		t.Fatalf("Carry without a block = %q, %v", got, err)
	}
}

func TestReadWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "performance.md")
	if doc, err := Read(path); err != nil || doc != "" {
		t.Fatalf("Read of a missing file = %q, %v", doc, err)
	}
	for _, doc := range []string{"first\n", "second\n"} {
		if err := Write(path, doc); err != nil {
			t.Fatal(err)
		}
		if got, err := Read(path); err != nil || got != doc {
			t.Fatalf("Read = %q, %v; want %q", got, err, doc)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("%d files beside the report, want none", len(entries)-1)
	}
}

// Each section replaces only its own block, and leaves another section's
// markers and figures as they were.
func TestSectionsAreIndependent(t *testing.T) {
	doc := "# Scaling\n\n" + Capacity.Wrap("old capacity") + "\n## Between\n\n" + Operations.Wrap("operations figures")
	got, err := Capacity.Put(doc, Capacity.Wrap("new capacity"))
	if err != nil {
		t.Fatal(err)
	}
	want := "# Scaling\n\n" + Capacity.Wrap("new capacity") + "\n## Between\n\n" + Operations.Wrap("operations figures")
	if got != want {
		t.Fatalf("Capacity.Put = %q; want %q", got, want)
	}
	if block, ok, err := Find(got); !ok || err != nil || block != Operations.Wrap("operations figures") {
		t.Fatalf("the operations block after Capacity.Put = %q, %v, %v", block, ok, err)
	}
}

// Carry keeps the roles section too, after the operations section.
func TestCarry_Roles(t *testing.T) {
	old := "# Old report\n\n" + Wrap("ops") + "\n" + Roles.Wrap("roles")
	got, err := Carry(old, "# New report\n")
	want := "# New report\n\n" + Wrap("ops") + "\n" + Roles.Wrap("roles")
	if err != nil || got != want {
		t.Fatalf("Carry = %q, %v; want %q", got, err, want)
	}
}

func TestCarry_HoldingAndNotes(t *testing.T) {
	old := "# Old report\n\n" + Notes.Wrap("notes") + "\n" + Holding.Wrap("holding") + "\n" + Roles.Wrap("roles")
	got, err := Carry(old, "# New report\n")
	want := "# New report\n\n" + Roles.Wrap("roles") + "\n" + Holding.Wrap("holding") + "\n" + Notes.Wrap("notes")
	if err != nil || got != want {
		t.Fatalf("Carry = %q, %v; want %q", got, err, want)
	}
}
