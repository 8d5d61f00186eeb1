// paced-driver: the fleet bench's load generator for paced latency runs (bench_hot.py's half_peak with
// --driver go). The Python driver spends about as much CPU per job as the worker it measures, on the same two
// cores; this publishes and listens for a fraction of that, so the latency it reports is more the fleet's own.
//
//	paced-driver -jobs JOBS -out TIMES.txt -rate 150 [-amqp-url URL] [-stall-seconds 30]
//
// JOBS: one job a line, ID<TAB>EXCHANGE<TAB>ROUTING_KEY<TAB>BODY, the body's bytes as they are (a compact JSON
// job holds no raw newline; bench_go.py checks).
// TIMES.txt: one line a job, in the jobs file's order: `job_id publish_ns end_ns`, CLOCK_MONOTONIC
// nanoseconds (end_ns -1: it never ended). Exit 0: every publish was confirmed (whether or not every job
// ended: see the summary on stderr); 1: a publish was nacked or returned unroutable; 2: bad usage or jobs
// file; 3: the broker connection or a channel failed.
//
// Builds offline against Debian's golang-github-rabbitmq-amqp091-go-dev: build.sh.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	exitRefused = 1
	exitUsage   = 2
	exitBroker  = 3
	clockMono   = 1 // CLOCK_MONOTONIC
)

// monoNs reads CLOCK_MONOTONIC itself: the workers' job timeline (JobTimeline.swift) and Python's
// time.monotonic() are on that clock, and Go exposes its own monotonic reading only relative to a time.Time.
func monoNs() int64 {
	var ts syscall.Timespec
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockMono, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", errno))
	}
	return ts.Sec*1e9 + ts.Nsec
}

type job struct {
	ID, Exchange, RoutingKey string
	Body                     []byte
}

func fail(code int, format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "paced-driver: "+format+"\n", a...)
	os.Exit(code)
}

// readJobs reads the whole file and slices it, bodies included, without copying or decoding: a JSON decode of
// a file of base64 bodies took more CPU than the paced run's publishing.
func readJobs(path string) []job {
	data, err := os.ReadFile(path)
	if err != nil {
		fail(exitUsage, "%v", err)
	}
	var jobs []job
	for line := 1; len(data) > 0; line++ {
		end := bytes.IndexByte(data, '\n')
		if end < 0 {
			end = len(data)
		}
		fields := bytes.SplitN(data[:end], []byte{'\t'}, 4)
		if end < len(data) {
			data = data[end+1:]
		} else {
			data = nil
		}
		if len(fields) == 1 && len(fields[0]) == 0 {
			continue
		}
		if len(fields) != 4 || len(fields[0]) == 0 {
			fail(exitUsage, "%s line %d: not ID<TAB>EXCHANGE<TAB>ROUTING_KEY<TAB>BODY", path, line)
		}
		jobs = append(jobs, job{string(fields[0]), string(fields[1]), string(fields[2]), fields[3]})
	}
	return jobs
}

// corkedConn holds what the library writes between cork and uncork and writes it in one call: amqp091
// flushes each frame of a publish (method, header, body) by itself, and three loopback writes a job cost the
// driver more CPU than all the rest of its work.
type corkedConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	held   []byte
}

func (c *corkedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *corkedConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

func (c *corkedConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	if len(c.held) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.held)
	c.held = c.held[:0]
	return err
}

// dial connects, through a corkedConn (returned too) that is never corked unless the caller does.
func dial(url, name string) (*amqp.Connection, *corkedConn) {
	var wrapped *corkedConn
	plain := amqp.DefaultDial(30 * time.Second)
	conn, err := amqp.DialConfig(url, amqp.Config{
		Properties: amqp.Table{"connection_name": name},
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := plain(network, addr)
			if err != nil {
				return nil, err
			}
			wrapped = &corkedConn{Conn: c}
			return wrapped, nil
		},
	})
	if err != nil {
		fail(exitBroker, "connecting (%s): %v", name, err)
	}
	return conn, wrapped
}

// event is all of a `failed` event the driver reads.
type event struct {
	JobID     string `json:"jobId"`
	WillRetry bool   `json:"willRetry"`
}

var jobIDKey = []byte(`"jobId":"`)

// completedJobID finds a `completed` event's job id without decoding the rest of it (its epochMetrics are
// most of its bytes): the first "jobId":" in the body, up to the next quote. Events are compact JSON and
// have no nested jobId; a quote inside a string is escaped, so cannot start a match. ok false (a spaced or
// escaped id): decode the event instead.
func completedJobID(body []byte) (id []byte, ok bool) {
	at := bytes.Index(body, jobIDKey)
	if at < 0 {
		return nil, false
	}
	rest := body[at+len(jobIDKey):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return nil, false
	}
	return rest[:end], true
}

func main() {
	jobsPath := flag.String("jobs", "", "the jobs file: a line a job, ID<TAB>EXCHANGE<TAB>ROUTING_KEY<TAB>BODY")
	outPath := flag.String("out", "", "where to write the times, a line a job: job_id publish_ns end_ns")
	rate := flag.Float64("rate", 0, "jobs/s: job i is published at start + i/rate")
	url := flag.String("amqp-url", os.Getenv("ATTUNE_AMQP_URL"), "the broker (default $ATTUNE_AMQP_URL)")
	eventsExchange := flag.String("events-exchange", "attune.events", "the exchange the workers publish events on")
	stall := flag.Float64("stall-seconds", 30, "give up once no job has ended for this long after the last publish")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here (go tool pprof)")
	flag.Parse()
	if *jobsPath == "" || *outPath == "" || *rate <= 0 || *url == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(exitUsage)
	}
	// One P: the work is a few goroutines handing each job along, and with more than one each handoff can
	// wake another thread (futex), which cost more than the handoffs themselves. GOMAXPROCS in the
	// environment still wins.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fail(exitUsage, "-cpuprofile: %v", err)
		}
		defer pprof.StopCPUProfile()
	}
	jobs := readJobs(*jobsPath)
	index := make(map[string]int, len(jobs))
	for i, j := range jobs {
		index[j.ID] = i
	}
	publishNs := make([]int64, len(jobs))
	endNs := make([]int64, len(jobs))
	for i := range endNs {
		endNs[i] = -1
	}

	// Events first: the queue must be bound before the first job can complete.
	eventsConn, _ := dial(*url, "attune-paced-driver-events")
	defer eventsConn.Close()
	eventsCh, err := eventsConn.Channel()
	if err != nil {
		fail(exitBroker, "events channel: %v", err)
	}
	q, err := eventsCh.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		fail(exitBroker, "declaring the events queue: %v", err)
	}
	for _, key := range []string{"*.*.completed", "*.*.failed"} {
		if err := eventsCh.QueueBind(q.Name, key, *eventsExchange, false, nil); err != nil {
			fail(exitBroker, "binding %s to %s: %v", key, *eventsExchange, err)
		}
	}
	deliveries, err := eventsCh.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		fail(exitBroker, "consuming the events: %v", err)
	}

	// endNs and failedEnds belong to this goroutine until `listened` closes; `ended` is what the main one watches.
	var ended, failedEnds, foreign, undecodable int64
	listened := make(chan struct{})
	go func() {
		defer close(listened)
		for d := range deliveries {
			now := monoNs()
			isFailed := strings.HasSuffix(d.RoutingKey, ".failed")
			id, ok := []byte(nil), false
			if !isFailed {
				id, ok = completedJobID(d.Body)
			}
			if !ok {
				var e event
				if err := json.Unmarshal(d.Body, &e); err != nil {
					undecodable++
					continue
				}
				if isFailed && e.WillRetry {
					continue // the job comes back: not its end
				}
				id = []byte(e.JobID)
			}
			i, ok := index[string(id)]
			if !ok {
				foreign++
				continue
			}
			if endNs[i] != -1 {
				continue // a duplicate's second report
			}
			endNs[i] = now
			if isFailed {
				failedEnds++
			}
			atomic.AddInt64(&ended, 1)
		}
	}()

	pubConn, pubSocket := dial(*url, "attune-paced-driver-publisher")
	defer pubConn.Close()
	pubCh, err := pubConn.Channel()
	if err != nil {
		fail(exitBroker, "publishing channel: %v", err)
	}
	if err := pubCh.Confirm(false); err != nil {
		fail(exitBroker, "confirm mode: %v", err)
	}
	// Buffered for every job, so neither notification can ever block the library's reader.
	confirms := pubCh.NotifyPublish(make(chan amqp.Confirmation, len(jobs)+1))
	returns := pubCh.NotifyReturn(make(chan amqp.Return, len(jobs)+1))
	pubClosed := pubCh.NotifyClose(make(chan *amqp.Error, 1))
	eventsClosed := eventsCh.NotifyClose(make(chan *amqp.Error, 1))
	var acked, nacked int64
	var refusals []string
	confirmed := make(chan struct{})
	go func() {
		defer close(confirmed)
		for c := range confirms {
			if c.Ack {
				acked++
			} else {
				nacked++
				if n := int(c.DeliveryTag) - 1; n >= 0 && n < len(jobs) && len(refusals) < 5 {
					refusals = append(refusals, "job "+jobs[n].ID+" nacked by the broker")
				}
			}
			if acked+nacked == int64(len(jobs)) {
				return
			}
		}
	}()

	interval := 1e9 / *rate
	start := monoNs()
	for i := range jobs {
		// Each publish's moment from the start, not from the previous one: a late publish does not push
		// the rest of the schedule back.
		if wait := start + int64(float64(i)*interval) - monoNs(); wait > 0 {
			time.Sleep(time.Duration(wait))
		}
		j := &jobs[i]
		publishNs[i] = monoNs()
		pubSocket.cork()
		err := pubCh.Publish(j.Exchange, j.RoutingKey, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: j.ID, Body: j.Body,
		})
		if err == nil {
			err = pubSocket.uncork()
		}
		if err != nil {
			fail(exitBroker, "publishing job %s: %v", j.ID, err)
		}
	}
	lastPublish := monoNs()

	select {
	case <-confirmed:
	case e := <-pubClosed:
		fail(exitBroker, "the publishing channel closed: %v", e)
	case <-time.After(120 * time.Second):
		fail(exitBroker, "%d of %d publishes unconfirmed after 120 s", int64(len(jobs))-acked-nacked, len(jobs))
	}
	allConfirmed := monoNs()
	// The broker sends a message's return before its confirm, and the library queues it before reading on,
	// so every return is in the buffer by now.
	returned := 0
	for drained := false; !drained; {
		select {
		case r := <-returns:
			returned++
			if len(refusals) < 10 {
				refusals = append(refusals, fmt.Sprintf("job %s unroutable on %s/%s (%d %s)",
					r.MessageId, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText))
			}
		default:
			drained = true
		}
	}

	// Until every job ended, or none has for -stall-seconds.
	stallNs := int64(*stall * 1e9)
	last, lastChange := atomic.LoadInt64(&ended), monoNs()
	ticker := time.NewTicker(20 * time.Millisecond)
	stalled := false
wait:
	for {
		select {
		case e := <-eventsClosed:
			fail(exitBroker, "the events channel closed: %v", e)
		case <-ticker.C:
		}
		n := atomic.LoadInt64(&ended)
		switch {
		case n == int64(len(jobs)):
			break wait
		case n != last:
			last, lastChange = n, monoNs()
		case monoNs()-lastChange > stallNs:
			stalled = true
			break wait
		}
	}
	ticker.Stop()
	// Stop the listener before reading what it wrote: closing the connection closes `deliveries`.
	eventsConn.Close()
	<-listened

	out, err := os.Create(*outPath)
	if err != nil {
		fail(exitUsage, "%v", err)
	}
	w := bufio.NewWriter(out)
	var latencies []float64
	for i, j := range jobs {
		fmt.Fprintf(w, "%s %d %d\n", j.ID, publishNs[i], endNs[i])
		if endNs[i] != -1 {
			latencies = append(latencies, float64(endNs[i]-publishNs[i])/1e6)
		}
	}
	if err := w.Flush(); err != nil {
		fail(exitUsage, "writing %s: %v", *outPath, err)
	}
	if err := out.Close(); err != nil {
		fail(exitUsage, "writing %s: %v", *outPath, err)
	}

	sort.Float64s(latencies)
	pct := func(q float64) float64 { // nearest rank, as bench_hot.percentiles
		if len(latencies) == 0 {
			return -1
		}
		k := int(math.Ceil(q * float64(len(latencies))))
		if k < 1 {
			k = 1
		}
		return latencies[k-1]
	}
	var usage syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &usage)
	cpu := float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e6
	fmt.Fprintf(os.Stderr, "paced-driver: %d jobs at %.1f jobs/s over %.2f s (confirmed %.2f s after the last "+
		"publish); acked %d, nacked %d, returned %d; ended %d (%d failed), %d never%s; p50 %.1f ms, p99 %.1f ms, "+
		"max %.1f ms; events of other jobs %d, undecodable %d; CPU %.0f ms (%.3f ms/job)\n",
		len(jobs), *rate, float64(lastPublish-start)/1e9, float64(allConfirmed-lastPublish)/1e9, acked, nacked,
		returned, len(latencies), failedEnds, len(jobs)-len(latencies),
		map[bool]string{true: fmt.Sprintf(" (stalled %.0f s)", *stall), false: ""}[stalled],
		pct(0.5), pct(0.99), pct(1), foreign, undecodable, cpu, cpu/float64(len(jobs)))
	if nacked > 0 || returned > 0 {
		fmt.Fprintf(os.Stderr, "paced-driver: publishing failed: %s\n", strings.Join(refusals, "; "))
		os.Exit(exitRefused)
	}
}
