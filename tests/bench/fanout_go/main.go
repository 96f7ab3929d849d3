// Command fanout is the load client of the fan-out benchmark
// (tests/bench/bench_resume.py): many websocket subscribers in one process,
// each recording the latency of every frame that carries a block's XADD time.
//
// It opens -n websockets to -url one after the other, sends -frame on each and
// waits for each one's first reply (the subscription id), then prints
//
//	ready
//
// and records, for every frame holding "t":"0x<16 hex digits> (the XADD time
// in ns since the epoch), now - t. It stops when every subscriber got -count
// such frames, when -duration has passed since ready, or when it reads a line
// "stop" on stdin (or stdin closes), prints one JSON line, then closes its
// sockets (a close frame each) and exits:
//
//	{"subscribers":500,"connected":500,"expected":250000,"received":250000,
//	 "complete":500,"p50_ms":1.2,"p99_ms":4.5,"max_ms":9.8,
//	 "errors":{"dial":0,"subscribe":0,"dropped":0,"malformed":0},
//	 "error_samples":[],"latencies_ms":[...]}
//
// latencies_ms (in µs steps) only with -latencies. A refused connection, a
// refused subscribe or a socket dropped before the end is counted in errors
// (the first few messages in error_samples); such a subscriber then counts as
// done for -count. Percentiles: the sorted sample at round(q/100*(len-1)).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// marker precedes the 16 hex digits of the XADD time in a notification.
var marker = []byte(`"t":"0x`)

const maxSamples = 5

// failures counts errors by kind and keeps the first few messages.
type failures struct {
	mu      sync.Mutex
	counts  map[string]int
	samples []string
}

func (f *failures) add(kind string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts[kind]++
	if len(f.samples) < maxSamples {
		f.samples = append(f.samples, kind+": "+err.Error())
	}
}

type subscriber struct {
	conn *websocket.Conn
	// latencies in ns, appended by the subscriber's reader only (read after it ended)
	latencies []int64
}

type run struct {
	count    int
	stopping atomic.Bool
	fails    *failures
	// one send per subscriber: when it got count frames, or when its socket dropped
	finished chan struct{}
	readers  sync.WaitGroup
}

// read records the latency of each marked frame until the socket closes.
func (r *run) read(s *subscriber) {
	defer r.readers.Done()
	var buf bytes.Buffer
	for {
		_, frame, err := s.conn.NextReader()
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(frame)
		}
		if err != nil {
			if !r.stopping.Load() {
				r.fails.add("dropped", err)
				if r.count == 0 || len(s.latencies) < r.count {
					r.finished <- struct{}{}
				}
			}
			return
		}
		now := time.Now().UnixNano()
		data := buf.Bytes()
		at := bytes.Index(data, marker)
		if at < 0 {
			continue
		}
		sent, ok := parseHex16(data[at+len(marker):])
		if !ok {
			r.fails.add("malformed", fmt.Errorf("no 16 hex digits after the marker: %.120q", data[at:]))
			continue
		}
		s.latencies = append(s.latencies, now-sent)
		if len(s.latencies) == r.count {
			r.finished <- struct{}{}
		}
	}
}

func parseHex16(b []byte) (int64, bool) {
	if len(b) < 16 {
		return 0, false
	}
	var v uint64
	for _, c := range b[:16] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint64(c)
	}
	return int64(v), true
}

// subscribe opens one socket, sends the frame and reads the first reply.
func subscribe(dialer *websocket.Dialer, url string, frame []byte, timeout time.Duration) (*websocket.Conn, string, error) {
	conn, _, err := dialer.Dial(url, nil)
	if err != nil {
		return nil, "dial", err
	}
	if err := conn.WriteMessage(websocket.TextMessage, frame); err != nil {
		conn.Close()
		return nil, "subscribe", err
	}
	conn.SetReadDeadline(time.Now().Add(timeout))
	_, reply, err := conn.ReadMessage()
	if err == nil && bytes.Contains(reply, []byte(`"error"`)) {
		err = fmt.Errorf("refused: %.200s", reply)
	}
	if err != nil {
		conn.Close()
		return nil, "subscribe", err
	}
	conn.SetReadDeadline(time.Time{})
	return conn, "", nil
}

// stopSignal is closed on a line "stop" on stdin, or when stdin closes.
func stopSignal() <-chan struct{} {
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		lines := bufio.NewScanner(os.Stdin)
		for lines.Scan() {
			if bytes.Equal(bytes.TrimSpace(lines.Bytes()), []byte("stop")) {
				return
			}
		}
	}()
	return stop
}

// stopReaders ends every reader (a read deadline in the past on each socket,
// which stays open) and waits for them: their latencies are then read safely.
func (r *run) stopReaders(subs []*subscriber) {
	r.stopping.Store(true)
	now := time.Now()
	for _, s := range subs {
		s.conn.UnderlyingConn().SetReadDeadline(now)
	}
	r.readers.Wait()
}

// closeAll sends a close frame on each socket and closes it.
func closeAll(subs []*subscriber) {
	bye := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")
	deadline := time.Now().Add(time.Second)
	for _, s := range subs {
		s.conn.WriteControl(websocket.CloseMessage, bye, deadline)
		s.conn.Close()
	}
}

type report struct {
	Subscribers  int            `json:"subscribers"`
	Connected    int            `json:"connected"`
	Expected     int            `json:"expected"`
	Received     int            `json:"received"`
	Complete     int            `json:"complete"`
	P50          *float64       `json:"p50_ms"`
	P99          *float64       `json:"p99_ms"`
	Max          *float64       `json:"max_ms"`
	Errors       map[string]int `json:"errors"`
	ErrorSamples []string       `json:"error_samples"`
	Latencies    []float64      `json:"latencies_ms,omitempty"`
}

// ms rounds ns to whole µs, in ms.
func ms(ns int64) float64 { return math.Round(float64(ns)/1e3) / 1e3 }

func at(sorted []int64, q float64) *float64 {
	if len(sorted) == 0 {
		return nil
	}
	v := ms(sorted[int(math.Round(q/100*float64(len(sorted)-1)))])
	return &v
}

func main() {
	url := flag.String("url", "", "websocket URL, e.g. ws://127.0.0.1:8080/ws")
	n := flag.Int("n", 500, "subscribers")
	frame := flag.String("frame", "", "subscribe frame sent on each socket")
	count := flag.Int("count", 0, "marked frames each subscriber expects; all in ends the run (0: no such end)")
	duration := flag.Duration("duration", 0, "record this long after ready (0: until stop)")
	timeout := flag.Duration("timeout", 30*time.Second, "handshake and first-reply timeout per socket")
	all := flag.Bool("latencies", false, "include every latency in the report")
	flag.Parse()
	if *url == "" || *frame == "" {
		fmt.Fprintln(os.Stderr, "fanout: -url and -frame are required")
		os.Exit(2)
	}

	fails := &failures{counts: map[string]int{"dial": 0, "subscribe": 0, "dropped": 0, "malformed": 0}}
	r := &run{count: *count, fails: fails, finished: make(chan struct{}, *n)}
	dialer := &websocket.Dialer{HandshakeTimeout: *timeout}
	subs := make([]*subscriber, 0, *n)
	for i := 0; i < *n; i++ {
		conn, kind, err := subscribe(dialer, *url, []byte(*frame), *timeout)
		if err != nil {
			fails.add(kind, err)
			continue
		}
		s := &subscriber{conn: conn}
		if *count > 0 {
			s.latencies = make([]int64, 0, *count)
		}
		subs = append(subs, s)
		r.readers.Add(1)
		go r.read(s)
	}
	stop := stopSignal()
	fmt.Println("ready")

	var timer <-chan time.Time
	if *duration > 0 {
		timer = time.After(*duration)
	}
	finished := 0
wait:
	for *count == 0 || finished < len(subs) {
		select {
		case <-r.finished:
			finished++
		case <-stop:
			break wait
		case <-timer:
			break wait
		}
	}
	r.stopReaders(subs)

	out := report{Subscribers: *n, Connected: len(subs), Expected: len(subs) * *count, Errors: fails.counts}
	var latencies []int64
	for _, s := range subs {
		latencies = append(latencies, s.latencies...)
		if *count > 0 && len(s.latencies) >= *count {
			out.Complete++
		}
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	out.Received = len(latencies)
	out.P50, out.P99, out.Max = at(latencies, 50), at(latencies, 99), at(latencies, 100)
	out.ErrorSamples = append([]string{}, fails.samples...)
	if *all {
		out.Latencies = make([]float64, len(latencies))
		for i, ns := range latencies {
			out.Latencies[i] = ms(ns)
		}
	}
	line, err := json.Marshal(out)
	if err != nil {
		panic(err)
	}
	os.Stdout.Write(append(line, '\n'))
	closeAll(subs)
	if len(subs) == 0 && *n > 0 {
		os.Exit(1) // not one subscriber: the report's errors say why
	}
}
