// Command producer runs cardinal-streams' own websocket producer
// (transports.NewWebsocketProducer with a StreamsResumption) on a port and
// produces the blocks it reads from stdin, one JSON command per line:
//
//	{"op":"block","num":N,"hash":"0x..","parent":"0x..","weight":"0x..",
//	 "values":{k:"0x.."},"deletes":[k],"batches":{prefix:"0xID"},
//	 "subbatches":{"0xID":{"values":{k:"0x.."},"deletes":[k]}}}
//	{"op":"reorg","num":N,"hash":"0x.."}
//
// It answers each command with {"event":"ok"} (or {"event":"error",...}) on
// stdout once the producer took it. Its resumer serves the canonical chain of
// what it produced (a block at N replaces N and everything above). Used by
// Sluice's tests only.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/big"
	"os"
	"runtime"
	"sync"

	log "github.com/inconshreveable/log15"
	"github.com/openrelayxyz/cardinal-streams/delivery"
	"github.com/openrelayxyz/cardinal-streams/transports"
	"github.com/openrelayxyz/cardinal-types"
	"github.com/openrelayxyz/cardinal-types/hexutil"
)

type subbatch struct {
	Values  map[string]string `json:"values"`
	Deletes []string          `json:"deletes"`
}

type command struct {
	Op         string              `json:"op"`
	Num        int64               `json:"num"`
	Hash       string              `json:"hash"`
	Parent     string              `json:"parent"`
	Weight     string              `json:"weight"`
	Values     map[string]string   `json:"values"`
	Deletes    []string            `json:"deletes"`
	Batches    map[string]string   `json:"batches"`
	Subbatches map[string]subbatch `json:"subbatches"`
}

type chain struct {
	mu        sync.Mutex
	blocks    map[int64]*delivery.PendingBatch
	head      int64
	threshold int64
}

func (c *chain) BlocksFrom(ctx context.Context, block uint64, hash types.Hash) (chan *delivery.PendingBatch, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := int64(block)
	if pb, ok := c.blocks[start]; !ok || pb.Hash != hash {
		start -= c.threshold
		if start < 0 {
			start = 0
		}
	}
	out := make(chan *delivery.PendingBatch, c.head-start+2)
	for n := start; n <= c.head; n++ {
		if pb, ok := c.blocks[n]; ok {
			out <- pb
		}
	}
	close(out)
	return out, nil
}

func (c *chain) GetBlock(ctx context.Context, block uint64) *delivery.PendingBatch {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blocks[int64(block)]
}

func decode(values map[string]string) map[string][]byte {
	out := make(map[string][]byte)
	for k, v := range values {
		out[k] = hexutil.MustDecode(v)
	}
	return out
}

func reply(v interface{}) {
	data, _ := json.Marshal(v)
	os.Stdout.Write(append(data, '\n'))
}

func main() {
	port := flag.Int("port", 0, "port to serve the websocket on")
	threshold := flag.Int64("threshold", 64, "reorg threshold of the resumer")
	flag.Parse()
	// cardinal-rpc v1.1.0 (the newest the module proxy serves) changes its registry's
	// maps with no lock: registry.Disconnect deletes while another connection subscribes
	// or leaves. On several OS threads a loaded machine saw "fatal error: concurrent map
	// writes" kill this producer. On one thread a map operation is never interleaved
	// (the runtime is not preempted inside it).
	runtime.GOMAXPROCS(1)
	// The library logs to stdout by default; stdout is this program's output.
	log.Root().SetHandler(log.LvlFilterHandler(log.LvlWarn, log.StreamHandler(os.Stderr, log.LogfmtFormat())))
	c := &chain{blocks: make(map[int64]*delivery.PendingBatch), head: -1, threshold: *threshold}
	producer, err := transports.NewWebsocketProducer(fmt.Sprintf("ws://127.0.0.1:%d", *port), c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "NewWebsocketProducer:", err)
		os.Exit(2)
	}
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 16<<20)
	for scanner.Scan() {
		var cmd command
		if err := json.Unmarshal(scanner.Bytes(), &cmd); err != nil {
			reply(map[string]string{"event": "error", "error": err.Error()})
			continue
		}
		switch cmd.Op {
		case "reorg":
			if _, err := producer.Reorg(cmd.Num, types.HexToHash(cmd.Hash)); err != nil {
				reply(map[string]string{"event": "error", "error": err.Error()})
				continue
			}
		case "block":
			weight, ok := new(big.Int).SetString(cmd.Weight[2:], 16)
			if !ok {
				reply(map[string]string{"event": "error", "error": "bad weight"})
				continue
			}
			updates := decode(cmd.Values)
			deletes := make(map[string]struct{})
			for _, k := range cmd.Deletes {
				deletes[k] = struct{}{}
			}
			batches := make(map[string]types.Hash)
			for prefix, id := range cmd.Batches {
				batches[prefix] = types.HexToHash(id)
			}
			whole := &delivery.PendingBatch{
				Number: cmd.Num, Weight: weight, Hash: types.HexToHash(cmd.Hash),
				ParentHash: types.HexToHash(cmd.Parent), Values: decode(cmd.Values),
				Deletes: make(map[string]struct{}),
			}
			for k := range deletes {
				whole.Deletes[k] = struct{}{}
			}
			for _, sb := range cmd.Subbatches {
				for k, v := range decode(sb.Values) {
					whole.Values[k] = v
				}
				for _, k := range sb.Deletes {
					whole.Deletes[k] = struct{}{}
				}
			}
			c.mu.Lock()
			for n := cmd.Num; n <= c.head; n++ {
				delete(c.blocks, n)
			}
			c.blocks[cmd.Num] = whole
			c.head = cmd.Num
			c.mu.Unlock()
			err := producer.AddBlock(cmd.Num, whole.Hash, whole.ParentHash, weight, updates, deletes, batches)
			for id, sb := range cmd.Subbatches {
				if err == nil {
					err = producer.SendBatch(types.HexToHash(id), sb.Deletes, decode(sb.Values))
				}
			}
			if err != nil {
				reply(map[string]string{"event": "error", "error": err.Error()})
				continue
			}
		default:
			reply(map[string]string{"event": "error", "error": "unknown op " + cmd.Op})
			continue
		}
		reply(map[string]string{"event": "ok"})
	}
}
