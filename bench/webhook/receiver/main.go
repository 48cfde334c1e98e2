// A webhook receiver for the webhook sink benchmark: answers every POST at once with 204 and
// counts the TCP connections it accepted, the requests it served and the events they carried (a
// body that is a JSON array carries one event per element, as the sink's events_per_request
// sends them; any other body one). Standard library only.
//
//	receiver            prints "<hooks address> <control address>" on stdout, then serves
//	GET  /stats         on the control address: {"connections":N,"requests":N,"events":N}
//	POST /reset         on the control address: zeroes the counters and forgets the arrivals
//	POST /record        on the control address: from now on, note each event's id (webhook-id, or
//	                    the element's "id") and arrival time (bench/sinks.py's commit-to-arrival
//	                    latency)
//	GET  /arrivals      on the control address: {"<id>": <unix nanoseconds>, ...}
//
// The control endpoints live on their own listener so the benchmark's own requests never count
// as connections the relay opened.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	var connections, requests, events atomic.Int64
	var recording atomic.Bool
	var mu sync.Mutex
	arrivals := map[string]int64{}
	buffers := sync.Pool{New: func() any { return new(bytes.Buffer) }} // no allocation per request

	hooks := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			buf := buffers.Get().(*bytes.Buffer)
			defer buffers.Put(buf)
			buf.Reset()
			_, _ = buf.ReadFrom(r.Body) // the whole body, so the connection stays reusable
			body := buf.Bytes()
			now := time.Now().UnixNano()
			ids := []string{r.Header.Get("webhook-id")}
			if trimmed := bytes.TrimSpace(body); len(trimmed) > 0 && trimmed[0] == '[' {
				var records []struct {
					ID json.RawMessage `json:"id"`
				}
				if err := json.Unmarshal(trimmed, &records); err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				ids = ids[:0]
				for _, rec := range records {
					ids = append(ids, string(bytes.Trim(rec.ID, `"`)))
				}
			}
			if recording.Load() {
				mu.Lock()
				for _, id := range ids {
					arrivals[id] = now
				}
				mu.Unlock()
			}
			requests.Add(1)
			events.Add(int64(len(ids)))
			w.WriteHeader(http.StatusNoContent)
		}),
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				connections.Add(1)
			}
		},
		IdleTimeout: 5 * time.Minute, // longer than any run: a new connection is the relay's choice
	}
	control := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stats":
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]int64{
				"connections": connections.Load(), "requests": requests.Load(), "events": events.Load()})
		case "/reset":
			connections.Store(0)
			requests.Store(0)
			events.Store(0)
			recording.Store(false)
			mu.Lock()
			arrivals = map[string]int64{}
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		case "/record":
			recording.Store(true)
			w.WriteHeader(http.StatusNoContent)
		case "/arrivals":
			w.Header().Set("Content-Type", "application/json")
			mu.Lock()
			_ = json.NewEncoder(w).Encode(arrivals)
			mu.Unlock()
		default:
			http.NotFound(w, r)
		}
	})}

	hooksLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	controlLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(hooksLn.Addr().String(), controlLn.Addr().String())
	go func() { log.Fatal(control.Serve(controlLn)) }()
	log.Fatal(hooks.Serve(hooksLn))
}
