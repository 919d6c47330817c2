// Command linearizability checks a history of gets and puts on a
// key-value store (JSON lines, see Record) for linearizability with
// porcupine, a register per key.
//
//	linearizability -history run/history.jsonl -timeout 5m -html run/violation.html
//
// It prints what it read and checked and its verdict, and exits 0 when the
// history is linearizable, 1 on a violation (writing porcupine's
// visualization of the violating keys to -html, when given), 2 when the
// input or the command line is wrong, and 3 when the check ran out of
// time before deciding (a history it could not verify is no pass).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

const (
	exitOK        = 0
	exitViolation = 1
	exitUsage     = 2
	exitUnknown   = 3
)

// Report is the checker's verdict and what it was reached on.
type Report struct {
	Records        int      `json:"records"`
	Checked        int      `json:"checked"`
	PendingKept    int      `json:"pending_kept"`
	PendingDropped int      `json:"pending_dropped"`
	Keys           int      `json:"keys"`
	Result         string   `json:"result"`     // linearizable, violation or unknown
	Violations     []string `json:"violations"` // keys whose operations are not linearizable
	Undecided      []string `json:"undecided"`  // keys the timeout left unchecked
	Visualization  string   `json:"visualization,omitempty"`
}

// Check checks every key's operations, several keys at once, all within
// one timeout, so that the report names each violating key (porcupine's
// own partitioned check stops at the first).
func Check(p Prepared, timeout time.Duration) Report {
	r := Report{
		Records:        p.Records,
		Checked:        len(p.Ops),
		PendingKept:    p.PendingKept,
		PendingDropped: p.PendingDropped,
		Keys:           len(p.Keys),
		Violations:     []string{},
		Undecided:      []string{},
	}
	parts := partitionByKey(p.Ops)
	results := make([]porcupine.CheckResult, len(parts))
	deadline := time.Now().Add(timeout)
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	for i, ops := range parts {
		wg.Add(1)
		go func(i int, ops []porcupine.Operation) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			left := time.Until(deadline)
			if left <= 0 { // porcupine reads a zero timeout as none
				results[i] = porcupine.Unknown
				return
			}
			results[i] = porcupine.CheckOperationsTimeout(kvModel, ops, left)
		}(i, ops)
	}
	wg.Wait()
	for i, res := range results {
		key := parts[i][0].Input.(kvInput).Key
		switch res {
		case porcupine.Illegal:
			r.Violations = append(r.Violations, key)
		case porcupine.Unknown:
			r.Undecided = append(r.Undecided, key)
		}
	}
	switch {
	case len(r.Violations) > 0:
		r.Result = "violation"
	case len(r.Undecided) > 0:
		r.Result = "unknown"
	default:
		r.Result = "linearizable"
	}
	return r
}

// Visualize writes porcupine's HTML view of the given keys' operations
// (their longest partial linearizations, and where each fails), with the
// faults drawn on a row of their own.
func Visualize(p Prepared, keys []string, timeout time.Duration, path string) error {
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	var ops []porcupine.Operation
	for _, op := range p.Ops {
		if want[op.Input.(kvInput).Key] {
			ops = append(ops, op)
		}
	}
	_, info := porcupine.CheckOperationsVerbose(kvModel, ops, timeout)
	info.AddAnnotations(FaultAnnotations(p.Faults))
	return porcupine.VisualizePath(kvModel, info, path)
}

func main() {
	historyPath := flag.String("history", "", "the history file (JSON lines; see Record)")
	timeout := flag.Duration("timeout", 5*time.Minute, "time the whole check may take")
	htmlPath := flag.String("html", "", "where to write the visualization on a violation")
	asJSON := flag.Bool("json", false, "print the report as one JSON object")
	flag.Parse()
	if *historyPath == "" || flag.NArg() != 0 || *timeout <= 0 {
		flag.Usage()
		os.Exit(exitUsage)
	}
	f, err := os.Open(*historyPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(exitUsage)
	}
	p, err := Load(bufio.NewReaderSize(f, 1<<20))
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", *historyPath, err)
		os.Exit(exitUsage)
	}
	r := Check(p, *timeout)
	if r.Result == "violation" && *htmlPath != "" {
		// As long again for the view: it re-checks only the failing keys.
		if err := Visualize(p, r.Violations, *timeout, *htmlPath); err != nil {
			fmt.Fprintf(os.Stderr, "visualization: %v\n", err)
		} else {
			r.Visualization = *htmlPath
		}
	}
	if *asJSON {
		out, _ := json.Marshal(r)
		fmt.Println(string(out))
	} else {
		printReport(r, *timeout)
	}
	switch r.Result {
	case "violation":
		os.Exit(exitViolation)
	case "unknown":
		os.Exit(exitUnknown)
	}
	os.Exit(exitOK)
}

func printReport(r Report, timeout time.Duration) {
	fmt.Printf("history: %d operations on %d keys\n", r.Records, r.Keys)
	fmt.Printf("checked: %d operations (%d of unknown outcome whose value was read, kept open to the end; "+
		"%d of unknown outcome left out, as nothing observed them)\n",
		r.Checked, r.PendingKept, r.PendingDropped)
	switch r.Result {
	case "linearizable":
		fmt.Println("result: linearizable, 0 violations")
	case "violation":
		fmt.Printf("result: NOT linearizable, %d violating keys: %v\n", len(r.Violations), r.Violations)
		if len(r.Undecided) > 0 {
			fmt.Printf("undecided within %v: %v\n", timeout, r.Undecided)
		}
		if r.Visualization != "" {
			fmt.Printf("visualization: %s\n", r.Visualization)
		}
	default:
		fmt.Printf("result: unknown, %d keys undecided within %v: %v\n", len(r.Undecided), timeout, r.Undecided)
	}
}
