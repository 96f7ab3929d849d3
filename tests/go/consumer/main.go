// Command consumer runs cardinal-streams' own websocket consumer against a
// server and prints what it sees, one JSON object per line on stdout:
//
//	{"event":"ready"}                          Ready() fired
//	{"event":"update","added":[...],"removed":[...]}  a ChainUpdate
//	{"event":"reorg","num":N,"hash":"0x.."}    a reorg notification
//
// Each block is {"num","hash","parent","weight","values","deletes"} with hex
// strings. It runs until stdin closes. Used by Sluice's tests only.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/big"
	"os"
	"regexp"
	"sort"
	"sync"

	log "github.com/inconshreveable/log15"
	"github.com/openrelayxyz/cardinal-streams/delivery"
	"github.com/openrelayxyz/cardinal-streams/transports"
	"github.com/openrelayxyz/cardinal-types"
	"github.com/openrelayxyz/cardinal-types/hexutil"
)

type block struct {
	Num     int64             `json:"num"`
	Hash    string            `json:"hash"`
	Parent  string            `json:"parent"`
	Weight  string            `json:"weight"`
	Values  map[string]string `json:"values"`
	Deletes []string          `json:"deletes"`
}

var outMu sync.Mutex

func emit(v interface{}) {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(data, '\n'))
}

func convert(pb *delivery.PendingBatch) block {
	b := block{
		Num:     pb.Number,
		Hash:    pb.Hash.Hex(),
		Parent:  pb.ParentHash.Hex(),
		Values:  map[string]string{},
		Deletes: []string{},
	}
	if pb.Weight != nil {
		b.Weight = (*hexutil.Big)(pb.Weight).String()
	}
	for k, v := range pb.Values {
		b.Values[k] = hexutil.Encode(v)
	}
	for k := range pb.Deletes {
		b.Deletes = append(b.Deletes, k)
	}
	sort.Strings(b.Deletes)
	return b
}

func main() {
	url := flag.String("url", "", "ws://host:port/cardinal")
	from := flag.Int64("from", 0, "last block number the consumer has")
	hash := flag.String("hash", "0x"+fmt.Sprintf("%064x", 0), "hash of that block")
	weight := flag.String("weight", "0x0", "weight of that block (hex)")
	threshold := flag.Int64("threshold", 64, "reorg threshold")
	flag.Parse()
	// The library logs to stdout by default; stdout is this program's output.
	log.Root().SetHandler(log.LvlFilterHandler(log.LvlWarn, log.StreamHandler(os.Stderr, log.LogfmtFormat())))
	lastWeight, ok := new(big.Int).SetString((*weight)[2:], 16)
	if !ok {
		fmt.Fprintln(os.Stderr, "bad -weight")
		os.Exit(2)
	}
	consumer, err := transports.ResolveConsumer(
		*url, "", nil, nil, 0, *from, types.HexToHash(*hash), lastWeight, *threshold,
		[]*regexp.Regexp{regexp.MustCompile(".*")}, nil,
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ResolveConsumer:", err)
		os.Exit(2)
	}
	updates := make(chan *delivery.ChainUpdate, 1000)
	reorgs := make(chan map[int64]types.Hash, 1000)
	consumer.Subscribe(updates)
	consumer.SubscribeReorg(reorgs)
	if err := consumer.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "Start:", err)
		os.Exit(2)
	}
	go func() {
		<-consumer.Ready()
		emit(map[string]string{"event": "ready"})
	}()
	// One goroutine for both feeds, so the lines keep the library's order: its
	// processor sends a reorg on the reorg feed before the updates that follow it,
	// so every reorg sent before an update is already buffered when that update
	// is received (drained first).
	emitReorg := func(r map[int64]types.Hash) {
		for num, h := range r {
			emit(map[string]interface{}{"event": "reorg", "num": num, "hash": h.Hex()})
		}
	}
	go func() {
		for {
			select {
			case r := <-reorgs:
				emitReorg(r)
			case u := <-updates:
			drain:
				for {
					select {
					case r := <-reorgs:
						emitReorg(r)
					default:
						break drain
					}
				}
				added := []block{}
				removed := []block{}
				for _, pb := range u.Added() {
					added = append(added, convert(pb))
				}
				for _, pb := range u.Removed() {
					removed = append(removed, convert(pb))
				}
				emit(map[string]interface{}{"event": "update", "added": added, "removed": removed})
				u.Done()
			}
		}
	}()
	io.Copy(io.Discard, bufio.NewReader(os.Stdin)) // run until stdin closes
	consumer.Close()
}
