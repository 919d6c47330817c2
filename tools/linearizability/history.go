package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/anishathalye/porcupine"
)

// Record is one line of a history file (JSON lines).
//
//	{"client":3,"op":"put","key":"k7","value":"c3-812","call":1200,"return":1900,"known":true,"via":"redis"}
//	{"client":4,"op":"get","key":"k7","value":null,"call":1300,"return":1500,"known":true,"via":"native"}
//	{"op":"fault","desc":"kill -9 server 1","call":1400,"return":2400}
//
// For a get, value is what it read (null: the key was absent); for a put,
// the value it wrote. call and return are the invocation and completion
// times in nanoseconds on one clock (the harness uses CLOCK_MONOTONIC,
// shared by every process of the host). known is false when the client
// cannot tell whether the operation took effect (a timeout, a connection
// error, any error): its return is then ignored. Keys and values are
// compared as strings, byte for byte.
//
// A "fault" line is not an operation: it marks when the harness injected a
// fault (desc) and is drawn beside the operations in the visualization.
type Record struct {
	Client int     `json:"client"`
	Op     string  `json:"op"`
	Key    string  `json:"key"`
	Value  *string `json:"value"`
	Call   int64   `json:"call"`
	Return *int64  `json:"return"`
	Known  *bool   `json:"known"`
	Via    string  `json:"via,omitempty"`
	Error  string  `json:"error,omitempty"`
	Desc   string  `json:"desc,omitempty"`
}

func (r *Record) validate() error {
	switch r.Op {
	case "fault":
		if r.Return == nil || *r.Return < r.Call {
			return fmt.Errorf("a fault needs return >= call")
		}
		return nil
	case "get", "put":
	default:
		return fmt.Errorf("op %q is none of get, put, fault", r.Op)
	}
	if r.Client < 0 {
		return fmt.Errorf("client %d is negative", r.Client)
	}
	if r.Known == nil {
		return fmt.Errorf("known is missing")
	}
	if r.Op == "put" && r.Value == nil {
		return fmt.Errorf("a put needs a value")
	}
	if *r.Known {
		if r.Return == nil {
			return fmt.Errorf("a known outcome needs its return time")
		}
		if *r.Return < r.Call {
			return fmt.Errorf("return %d is before call %d", *r.Return, r.Call)
		}
	}
	return nil
}

// Prepared is what goes to porcupine, with the counts the report prints.
type Prepared struct {
	Ops []porcupine.Operation
	// Faults are the fault marks, for the visualization.
	Faults []Record
	// Records counts every get and put read from the file.
	Records int
	// PendingKept counts puts of unknown outcome whose value some read
	// returned: they are checked, open until the end of the history.
	PendingKept int
	// PendingDropped counts puts of unknown outcome nobody read and gets
	// of unknown outcome: left out, as they constrain nothing.
	PendingDropped int
	Keys           []string
}

// Load reads a history (JSON lines) and turns it into porcupine
// operations, rejecting any line that is not a well-formed get, put or
// fault (a history the checker misread would make its verdict
// meaningless, so nothing is skipped silently).
//
// An operation of unknown outcome may have taken effect at any time after
// its call, or never: the standard treatment gives it a completion time of
// +infinity, here one past the last time in the history (nothing is
// invoked after it, so that is the same). Two reductions keep the search
// small without changing the verdict:
//
//   - a get of unknown outcome is dropped: its result is unknown, so any
//     linearization may place it anywhere in its open interval, and it
//     constrains nothing;
//   - a put of unknown outcome whose value no completed get of its key
//     returned is dropped: open until the end, it can always be linearized
//     after every other operation, where it changes nothing anyone
//     observed. One whose value was read must have taken effect, and is
//     kept (open until the end), so that the read is explained.
//
// Without the second, every failed write would stay concurrent with the
// rest of the run, and a run with many faults would branch the search
// exponentially.
//
// One pass, converting each line as it comes (an hour's history holds
// millions): only the puts of unknown outcome wait for the end, when the
// values read and the last time are known.
func Load(r io.Reader) (Prepared, error) {
	var p Prepared
	var end int64
	read := make(map[string]map[string]bool) // key -> values gets returned
	var pending []Record                     // puts of unknown outcome
	strs := make(map[string]string)          // interned keys and client kinds
	intern := func(s string) string {
		if v, ok := strs[s]; ok {
			return v
		}
		strs[s] = s
		return s
	}
	keys := make(map[string]bool)
	add := func(rec Record, ret int64, out kvOutput) {
		in := kvInput{Key: rec.Key}
		if rec.Op == "put" {
			in.Op, in.Value = opPut, *rec.Value
		}
		keys[rec.Key] = true
		p.Ops = append(p.Ops, porcupine.Operation{
			ClientId: rec.Client,
			Input:    in,
			Call:     rec.Call,
			Output:   out,
			Return:   ret,
			Metadata: describeMeta(rec),
		})
	}

	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Bytes()
		if len(text) == 0 {
			continue
		}
		var rec Record
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return p, fmt.Errorf("line %d: %v", line, err)
		}
		if err := rec.validate(); err != nil {
			return p, fmt.Errorf("line %d: %v", line, err)
		}
		if rec.Call > end {
			end = rec.Call
		}
		if rec.Return != nil && *rec.Return > end {
			end = *rec.Return
		}
		if rec.Op == "fault" {
			p.Faults = append(p.Faults, rec)
			continue
		}
		p.Records++
		rec.Key, rec.Via = intern(rec.Key), intern(rec.Via)
		known := *rec.Known
		switch {
		case rec.Op == "get" && !known:
			p.PendingDropped++
		case rec.Op == "get":
			out := kvOutput{}
			if rec.Value != nil {
				out = kvOutput{Present: true, Value: *rec.Value}
				if read[rec.Key] == nil {
					read[rec.Key] = make(map[string]bool)
				}
				read[rec.Key][*rec.Value] = true
			}
			add(rec, *rec.Return, out)
		case !known:
			pending = append(pending, rec)
		default:
			add(rec, *rec.Return, kvOutput{})
		}
	}
	if err := sc.Err(); err != nil {
		return p, fmt.Errorf("line %d: %v", line+1, err)
	}
	for _, rec := range pending {
		if !read[rec.Key][*rec.Value] {
			p.PendingDropped++
			continue
		}
		p.PendingKept++
		add(rec, end+1, kvOutput{Unknown: true})
	}
	for k := range keys {
		p.Keys = append(p.Keys, k)
	}
	sort.Strings(p.Keys)
	return p, nil
}

// describeMeta is the line the visualization shows under an operation.
func describeMeta(r Record) string {
	s := r.Via
	if !*r.Known {
		if s != "" {
			s += ", "
		}
		s += "outcome unknown"
		if r.Error != "" {
			s += ": " + r.Error
		}
	}
	return s
}

// FaultAnnotations draws the faults on a row of their own.
func FaultAnnotations(faults []Record) []porcupine.Annotation {
	var out []porcupine.Annotation
	for _, f := range faults {
		out = append(out, porcupine.Annotation{
			Tag:             "faults",
			Start:           f.Call,
			End:             *f.Return,
			Description:     f.Desc,
			BackgroundColor: "#f4cccc",
		})
	}
	return out
}
