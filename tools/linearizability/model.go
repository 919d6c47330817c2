package main

import (
	"fmt"
	"hash/fnv"
	"sort"

	"github.com/anishathalye/porcupine"
)

type opKind uint8

const (
	opGet opKind = iota
	opPut
)

type kvInput struct {
	Op    opKind
	Key   string
	Value string // put: the value written
}

// kvOutput is what a get returned; a put's output is ignored.
type kvOutput struct {
	Present bool
	Value   string
	// Unknown marks a put of unknown outcome, for the visualization.
	Unknown bool
}

// kvState is one key's value: the model is partitioned by key, so a
// partition's state is a single register (absent until the first put).
type kvState struct {
	Present bool
	Value   string
}

// kvModel is a register per key: a get returns the last put's value, or
// nothing before any put. Partitioned by key (porcupine checks each key's
// operations on its own, in parallel: a history is linearizable if and
// only if every key's is, as the keys are independent registers).
var kvModel = porcupine.Model{
	Partition: partitionByKey,
	Init:      func() interface{} { return kvState{} },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		in := input.(kvInput)
		st := state.(kvState)
		if in.Op == opPut {
			return true, kvState{Present: true, Value: in.Value}
		}
		out := output.(kvOutput)
		return out.Present == st.Present && out.Value == st.Value, st
	},
	Hash: func(state interface{}) uint64 {
		st := state.(kvState)
		h := fnv.New64a()
		if st.Present {
			h.Write([]byte{1})
		}
		h.Write([]byte(st.Value))
		return h.Sum64()
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(kvInput)
		out := output.(kvOutput)
		if in.Op == opPut {
			if out.Unknown {
				return fmt.Sprintf("put(%q, %q) ?", in.Key, in.Value)
			}
			return fmt.Sprintf("put(%q, %q)", in.Key, in.Value)
		}
		if !out.Present {
			return fmt.Sprintf("get(%q) -> nil", in.Key)
		}
		return fmt.Sprintf("get(%q) -> %q", in.Key, out.Value)
	},
	DescribeState: func(state interface{}) string {
		st := state.(kvState)
		if !st.Present {
			return "nil"
		}
		return fmt.Sprintf("%q", st.Value)
	},
}

// partitionByKey splits a history by key, in key order (so that reports
// and visualizations come out the same on every run).
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	by := make(map[string][]porcupine.Operation)
	for _, op := range history {
		k := op.Input.(kvInput).Key
		by[k] = append(by[k], op)
	}
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, by[k])
	}
	return out
}
