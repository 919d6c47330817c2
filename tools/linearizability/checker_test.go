package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func check(t *testing.T, lines string) (Prepared, Report) {
	t.Helper()
	p, err := Load(strings.NewReader(lines))
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return p, Check(p, 10*time.Second)
}

// Two clients on two keys: overlapping operations that some order explains
// (the get concurrent with the put may see either value), and a put whose
// client timed out but whose value a later get read: it took effect.
const linearizable = `
{"client":0,"op":"put","key":"a","value":"1","call":0,"return":10,"known":true}
{"client":1,"op":"get","key":"a","value":"1","call":5,"return":15,"known":true}
{"client":0,"op":"put","key":"a","value":"2","call":20,"return":40,"known":true}
{"client":1,"op":"get","key":"a","value":"1","call":21,"return":25,"known":true}
{"client":1,"op":"get","key":"a","value":"2","call":30,"return":35,"known":true}
{"client":1,"op":"get","key":"b","value":null,"call":0,"return":5,"known":true}
{"client":0,"op":"put","key":"b","value":"x","call":50,"return":60,"known":false,"error":"timeout"}
{"client":1,"op":"get","key":"b","value":"x","call":100,"return":110,"known":true}
{"op":"fault","desc":"kill -9 server 1","call":45,"return":55}
`

func TestLinearizableHistoryPasses(t *testing.T) {
	p, r := check(t, linearizable)
	if r.Result != "linearizable" || len(r.Violations) != 0 {
		t.Fatalf("want linearizable, got %+v", r)
	}
	if r.Records != 8 || r.Checked != 8 || r.PendingKept != 1 || r.Keys != 2 {
		t.Fatalf("counts: %+v", r)
	}
	// The unknown put is open until past the last time in the history.
	for _, op := range p.Ops {
		if op.Input.(kvInput).Value == "x" && op.Return != 111 {
			t.Fatalf("unknown put returns at %d, want 111", op.Return)
		}
	}
}

// A stale read: once put(a, 2) completed, a get invoked later may not
// return 1.
const staleRead = `
{"client":0,"op":"put","key":"a","value":"1","call":0,"return":10,"known":true}
{"client":0,"op":"put","key":"a","value":"2","call":20,"return":30,"known":true}
{"client":1,"op":"get","key":"a","value":"1","call":40,"return":50,"known":true}
{"client":1,"op":"get","key":"b","value":null,"call":40,"return":50,"known":true}
`

// A lost write: an acknowledged put, then the key reads as absent (what a
// server that restarted empty answers).
const lostWrite = `
{"client":0,"op":"put","key":"k","value":"v","call":0,"return":10,"known":true}
{"client":1,"op":"get","key":"k","value":"v","call":20,"return":30,"known":true}
{"client":1,"op":"get","key":"k","value":null,"call":40,"return":50,"known":true}
`

func TestViolationsAreFoundAndNamed(t *testing.T) {
	for name, lines := range map[string]string{"stale read": staleRead, "lost write": lostWrite} {
		_, r := check(t, lines)
		if r.Result != "violation" {
			t.Fatalf("%s: want a violation, got %+v", name, r)
		}
		want := []string{"a"}
		if name == "lost write" {
			want = []string{"k"}
		}
		if !reflect.DeepEqual(r.Violations, want) {
			t.Fatalf("%s: violations %v, want %v", name, r.Violations, want)
		}
	}
}

// A put of unknown outcome may take effect however late: a read long after
// its call may still see it, even after a later acknowledged put was read,
// so long as some order explains every read.
func TestUnknownPutMayTakeEffectLate(t *testing.T) {
	_, r := check(t, `
{"client":0,"op":"put","key":"a","value":"1","call":0,"return":10,"known":false,"error":"connection reset"}
{"client":1,"op":"put","key":"a","value":"2","call":20,"return":30,"known":true}
{"client":1,"op":"get","key":"a","value":"2","call":40,"return":50,"known":true}
{"client":1,"op":"get","key":"a","value":"1","call":60,"return":70,"known":true}
`)
	if r.Result != "linearizable" {
		t.Fatalf("want linearizable, got %+v", r)
	}
	// But once it was seen, it cannot be unseen in favour of an older
	// value: 1 read, then 2 (written before 1's put began) is stale.
	_, r = check(t, `
{"client":1,"op":"put","key":"a","value":"2","call":0,"return":10,"known":true}
{"client":0,"op":"put","key":"a","value":"1","call":20,"return":30,"known":false}
{"client":1,"op":"get","key":"a","value":"1","call":40,"return":50,"known":true}
{"client":1,"op":"get","key":"a","value":"2","call":60,"return":70,"known":true}
`)
	if r.Result != "violation" {
		t.Fatalf("want a violation, got %+v", r)
	}
}

// Operations of unknown outcome that nobody observed are left out; a read
// of a value nobody wrote is a violation whatever failed.
func TestUnobservedUnknownsAreDropped(t *testing.T) {
	_, r := check(t, `
{"client":0,"op":"put","key":"a","value":"1","call":0,"return":10,"known":true}
{"client":0,"op":"put","key":"a","value":"2","call":20,"known":false}
{"client":1,"op":"get","key":"a","call":25,"known":false}
{"client":1,"op":"get","key":"a","value":"1","call":40,"return":50,"known":true}
`)
	if r.Result != "linearizable" || r.Checked != 2 || r.PendingDropped != 2 {
		t.Fatalf("want 2 checked, 2 dropped, linearizable: %+v", r)
	}
	_, r = check(t, `
{"client":0,"op":"put","key":"a","value":"1","call":0,"return":10,"known":false}
{"client":1,"op":"get","key":"a","value":"3","call":40,"return":50,"known":true}
`)
	if r.Result != "violation" {
		t.Fatalf("a read of a value never written: want a violation, got %+v", r)
	}
}

func TestMalformedLinesAreRejected(t *testing.T) {
	for _, bad := range []string{
		`{"client":0,"op":"put","key":"a","value":"1","call":0,"return":10}`,                // known missing
		`{"client":0,"op":"cas","key":"a","value":"1","call":0,"return":10,"known":true}`,   // unknown op
		`{"client":0,"op":"put","key":"a","call":0,"return":10,"known":true}`,               // put without a value
		`{"client":0,"op":"get","key":"a","call":0,"known":true}`,                           // known, no return
		`{"client":0,"op":"get","key":"a","call":10,"return":5,"known":true}`,               // returns before its call
		`{"client":0,"op":"get","key":"a","call":0,"return":5,"known":true,"colour":"red"}`, // a field of no meaning
		`not json`,
	} {
		if _, err := Load(strings.NewReader(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func TestVisualizationIsWritten(t *testing.T) {
	p, err := Load(strings.NewReader(staleRead + `{"op":"fault","desc":"SIGSTOP server 0","call":12,"return":18}` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "v.html")
	if err := Visualize(p, []string{"a"}, 10*time.Second, path); err != nil {
		t.Fatal(err)
	}
	html, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`get(\"a\") -\u003e \"1\"`, "SIGSTOP server 0"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("the visualization lacks %s", want)
		}
	}
}
