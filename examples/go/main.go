// Command attune-producer publishes one training job to an Attune fleet and waits for its outcome.
//
// It follows the producer spec (docs/publishing-jobs.md#producer-spec): the job is the JSON mapping of
// attune.v1.TrainingJob, published to the exchange attune.jobs with the user id as routing key,
// persistent, mandatory, under publisher confirms, message_id = job id. Before publishing it binds a
// server-named exclusive queue to attune.events with `<model>.<user>.*`, so no event of the job can be
// missed, and then prints that job's events until one ends it.
//
// Exit status: 0 completed (the new version is printed), 1 the job failed or was cancelled (the reason is
// printed), 2 bad usage, 3 the broker did not take the job (returned, nacked, refused), 4 no outcome
// within --timeout (the job may still be applied later: it stays queued).
//
// Builds from Debian's golang-go and golang-github-rabbitmq-amqp091-go-dev, offline (see README.md).
package main

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	jobsExchange   = "attune.jobs"
	eventsExchange = "attune.events"
)

const (
	exitCompleted = 0
	exitJobFailed = 1
	exitUsage     = 2
	exitPublish   = 3
	exitTimeout   = 4
)

// The id alphabet workers accept; an id outside it would be reported under the routing-key word `~`,
// where the binding below would never see it, so it is refused here first.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// One digit "0" of examples/data/digits.csv.gz (row 0), for a run without --csv.
var builtinSample = []float64{
	0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0,
	0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0,
	0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0,
	0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0,
}

type options struct {
	url, eventsURL, model, user, jobID, csv, rows, inputFeature, labelFeature string
	epochs                                                                    int
	timeout                                                                   time.Duration
}

type row struct {
	values []float64
	label  string
}

func main() {
	opts := parseFlags()
	rows, err := loadRows(opts)
	if err != nil {
		fail(exitUsage, "%v", err)
	}
	body, err := json.Marshal(trainingJob(opts, rows))
	if err != nil {
		fail(exitUsage, "cannot encode the job: %v", err)
	}
	os.Exit(run(opts, body))
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.url, "amqp-url", os.Getenv("ATTUNE_AMQP_URL"), "broker URL (default: $ATTUNE_AMQP_URL)")
	flag.StringVar(&o.eventsURL, "events-amqp-url", os.Getenv("ATTUNE_EVENTS_AMQP_URL"),
		"broker URL to watch events with, for a producer whose publishing and watching users are split "+
			"(scripts/producer-user.sh --split; default: $ATTUNE_EVENTS_AMQP_URL, else --amqp-url)")
	flag.StringVar(&o.model, "model", "digits", "model name")
	flag.StringVar(&o.user, "user", "", "user id, also the routing key (required)")
	flag.StringVar(&o.jobID, "job-id", "", "job id (default: a new random UUID); reuse it to retry a publish")
	flag.StringVar(&o.csv, "csv", "", "CSV of numbers then a label per row, .csv.gz read directly (default: one built-in digit)")
	flag.StringVar(&o.rows, "rows", "", "START:END of the CSV rows to send (default: all)")
	flag.IntVar(&o.epochs, "epochs", 0, "epochs override (default: the model's)")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long to wait for the job's outcome")
	flag.StringVar(&o.inputFeature, "input-feature", "pixels", "the model's input feature")
	flag.StringVar(&o.labelFeature, "label-feature", "digit", "the model's label feature")
	flag.Parse()
	if o.url == "" {
		fail(exitUsage, "give --amqp-url or set ATTUNE_AMQP_URL")
	}
	if o.jobID == "" {
		o.jobID = newUUID()
	}
	for name, value := range map[string]string{"--model": o.model, "--user": o.user, "--job-id": o.jobID} {
		if !idPattern.MatchString(value) {
			fail(exitUsage, "%s %q: must be 1 to 128 of A-Z a-z 0-9 _ - (workers refuse anything else)", name, value)
		}
	}
	if o.timeout <= 0 {
		fail(exitUsage, "--timeout must be positive, e.g. 90s")
	}
	return o
}

func loadRows(o options) ([]row, error) {
	if o.csv == "" {
		return []row{{values: builtinSample, label: "0"}}, nil
	}
	f, err := os.Open(o.csv)
	if err != nil {
		return nil, fmt.Errorf("cannot read --csv: %v", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(o.csv, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s is not gzip: %v", o.csv, err)
		}
		r = gz
	}
	var lines []string
	scanner := bufio.NewScanner(r)
	for scanner.Scan() {
		if line := strings.TrimSpace(scanner.Text()); line != "" {
			lines = append(lines, line)
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %v", o.csv, err)
	}
	start, end, err := rowRange(o.rows, len(lines))
	if err != nil {
		return nil, err
	}
	var rows []row
	for i, line := range lines[start:end] {
		cells := strings.Split(line, ",")
		if len(cells) < 2 {
			return nil, fmt.Errorf("%s row %d: want numbers then a label", o.csv, start+i)
		}
		values := make([]float64, len(cells)-1)
		for j, cell := range cells[:len(cells)-1] {
			if values[j], err = strconv.ParseFloat(strings.TrimSpace(cell), 64); err != nil {
				return nil, fmt.Errorf("%s row %d column %d: %v", o.csv, start+i, j, err)
			}
		}
		rows = append(rows, row{values: values, label: strings.TrimSpace(cells[len(cells)-1])})
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("no rows in %s %s", o.csv, o.rows)
	}
	return rows, nil
}

// rowRange reads START:END as Python's slice does (either side may be empty).
func rowRange(spec string, count int) (int, int, error) {
	start, end := 0, count
	if spec == "" {
		return start, end, nil
	}
	a, b, ok := strings.Cut(spec, ":")
	if !ok {
		return 0, 0, fmt.Errorf("--rows %q: want START:END", spec)
	}
	var err error
	if a != "" {
		if start, err = strconv.Atoi(a); err != nil {
			return 0, 0, fmt.Errorf("--rows %q: %v", spec, err)
		}
	}
	if b != "" {
		if end, err = strconv.Atoi(b); err != nil {
			return 0, 0, fmt.Errorf("--rows %q: %v", spec, err)
		}
	}
	if start < 0 || end > count || start > end {
		return 0, 0, fmt.Errorf("--rows %q: the file has %d rows", spec, count)
	}
	return start, end, nil
}

// trainingJob is the protobuf JSON mapping of attune.v1.TrainingJob: camelCase names, no "shape" (a flat
// list takes the model's input shape when the count matches).
func trainingJob(o options, rows []row) map[string]any {
	samples := make([]any, len(rows))
	for i, r := range rows {
		samples[i] = map[string]any{"features": map[string]any{
			o.inputFeature: map[string]any{"multiArray": map[string]any{"values": r.values}},
			o.labelFeature: map[string]any{"stringValue": r.label},
		}}
	}
	job := map[string]any{"jobId": o.jobID, "userId": o.user, "model": o.model, "samples": samples}
	if o.epochs != 0 {
		job["parameters"] = map[string]any{"epochs": o.epochs}
	}
	return job
}

func run(o options, body []byte) int {
	conn, err := dial(o.url)
	if err != nil {
		return failed(exitPublish, "%v", err)
	}
	defer conn.Close()
	eventsConn := conn
	if o.eventsURL != "" && o.eventsURL != o.url {
		if eventsConn, err = dial(o.eventsURL); err != nil {
			return failed(exitPublish, "%v (--events-amqp-url)", err)
		}
		defer eventsConn.Close()
	}

	events, err := watchEvents(eventsConn, o)
	if err != nil {
		return failed(exitPublish, "%v", err)
	}
	if err := publish(conn, o, body); err != nil {
		return failed(exitPublish, "%v", err)
	}
	fmt.Printf("published job %s for %s/%s (%d bytes); waiting up to %s for its outcome\n",
		o.jobID, o.model, o.user, len(body), o.timeout)
	return awaitOutcome(events, o)
}

func dial(url string) (*amqp.Connection, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Properties: amqp.Table{"connection_name": "attune-go-producer"}})
	if err != nil {
		return nil, fmt.Errorf("cannot connect to the broker: %v", explain(err))
	}
	return conn, nil
}

// watchEvents binds a server-named, exclusive queue to the job's events before the job is published, so
// even a job refused at once is seen. A producer user needs only amq.gen-* and attune.events for this.
func watchEvents(conn *amqp.Connection, o options) (<-chan amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("cannot open a channel: %v", err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return nil, fmt.Errorf("cannot declare a queue for the events: %v", explain(err))
	}
	key := o.model + "." + o.user + ".*"
	if err := ch.QueueBind(q.Name, key, eventsExchange, false, nil); err != nil {
		return nil, fmt.Errorf("cannot bind %s on %s: %v", key, eventsExchange, explain(err))
	}
	// A body no worker can read (over the size limit, say) is reported under `~.~.failed` with the
	// message_id as jobId. That key shows other producers' failures too, so it may not be granted: a
	// refusal closes only the channel it is tried on, and the job's own key still works.
	if extra, err := conn.Channel(); err == nil {
		if err := extra.QueueBind(q.Name, "~.~.failed", eventsExchange, false, nil); err != nil {
			fmt.Fprintf(os.Stderr, "not watching ~.~.failed (%v): a job no worker can read times out here\n", err)
		} else {
			extra.Close()
		}
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("cannot consume the events: %v", explain(err))
	}
	return deliveries, nil
}

// publish sends the job on a channel in confirm mode and waits for the broker's answer. A mandatory
// message no queue takes comes back as basic.return before its basic.ack, and the library hands frames
// over in order, so a return is always seen by the time the ack is.
func publish(conn *amqp.Connection, o options, body []byte) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("cannot open a channel: %v", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("the broker refused publisher confirms: %v", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = ch.PublishWithContext(ctx, jobsExchange, o.user, true, false, amqp.Publishing{
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    o.jobID,
		Timestamp:    time.Now(),
		Body:         body,
	})
	if err != nil {
		return fmt.Errorf("cannot publish job %s: %v", o.jobID, err)
	}
	select {
	case confirm, ok := <-confirms:
		if !ok {
			return channelClosed(o, <-closed)
		}
		select {
		case ret := <-returns:
			return fmt.Errorf("job %s was returned unroutable (%d %s): no queue is bound to %s; run `attune topology declare` "+
				"(or start a worker) and publish it again under the same job id; never drop it",
				o.jobID, ret.ReplyCode, ret.ReplyText, jobsExchange)
		default:
		}
		if !confirm.Ack {
			return fmt.Errorf("the broker nacked job %s (it could not take it): publish it again under the same job id, "+
				"which is applied once", o.jobID)
		}
		return nil
	case e := <-closed:
		return channelClosed(o, e)
	case <-ctx.Done():
		return fmt.Errorf("no confirm for job %s within 30s: its fate is unknown; publish it again under the same job id", o.jobID)
	}
}

func channelClosed(o options, e *amqp.Error) error {
	if e == nil {
		return fmt.Errorf("the channel closed before job %s was confirmed: publish it again under the same job id", o.jobID)
	}
	return fmt.Errorf("publishing job %s: %v", o.jobID, explain(e))
}

// explain adds what to do to the broker's two common refusals.
func explain(err error) string {
	var e *amqp.Error
	if errors.As(err, &e) {
		switch e.Code {
		case amqp.AccessRefused:
			return fmt.Sprintf("%s (403): this user lacks the permission; see scripts/producer-user.sh for what a producer is granted", e.Reason)
		case amqp.NotFound:
			return fmt.Sprintf("%s (404): the fleet's topology is missing; run `attune topology declare`", e.Reason)
		}
	}
	return err.Error()
}

// event holds the fields of attune.v1.Event this program acts on (docs/events.md); 64-bit integers are
// JSON strings in the protobuf mapping.
type event struct {
	Kind        string `json:"kind"`
	JobID       string `json:"jobId"`
	Version     string `json:"version"`
	Reason      string `json:"reason"`
	WillRetry   bool   `json:"willRetry"`
	Duplicate   bool   `json:"duplicate"`
	CancelStage string `json:"cancelStage"`
}

// epochs holds the fields that report epochs, decoded apart from event so that a surprise in them never
// costs the job's outcome: an EPOCH_END's own, and a terminal event's epochMetrics.
type epochs struct {
	Epoch              string         `json:"epoch"`
	Epochs             string         `json:"epochs"`
	Loss               protoDouble    `json:"loss"`
	ValidationLoss     *protoDouble   `json:"validationLoss"`
	ValidationAccuracy *protoDouble   `json:"validationAccuracy"`
	EpochMetrics       []epochMetrics `json:"epochMetrics"`
}

// epochMetrics is one entry of a terminal event's epochMetrics (event contract 2): the epochs of a job whose
// task ended within the worker's --progress-after, which published no EPOCH_END of its own. The validation
// fields are present only when measured.
type epochMetrics struct {
	Epoch              string       `json:"epoch"`
	Loss               protoDouble  `json:"loss"`
	ValidationLoss     *protoDouble `json:"validationLoss"`
	ValidationAccuracy *protoDouble `json:"validationAccuracy"`
}

// protoDouble is a double of the protobuf JSON mapping: a number, or "NaN", "Infinity", "-Infinity".
type protoDouble float64

func (d *protoDouble) UnmarshalJSON(data []byte) error {
	var text string
	if err := json.Unmarshal(data, &text); err == nil {
		value, err := strconv.ParseFloat(text, 64) // reads NaN, Infinity and -Infinity
		if err != nil {
			return fmt.Errorf("a double that is neither a number nor NaN/Infinity/-Infinity: %q", text)
		}
		*d = protoDouble(value)
		return nil
	}
	var value float64
	if err := json.Unmarshal(data, &value); err != nil {
		return err
	}
	*d = protoDouble(value)
	return nil
}

// epochLine is what an EPOCH_END says, and what each entry of a terminal event's epochMetrics says alike.
func epochLine(jobID, epoch, of string, loss protoDouble, validationLoss, validationAccuracy *protoDouble) string {
	if epoch == "" {
		epoch = "0"
	}
	if of != "" {
		epoch += "/" + of
	}
	line := fmt.Sprintf("job %s epoch %s loss %.4f", jobID, epoch, float64(loss))
	var validation []string
	if validationLoss != nil {
		validation = append(validation, fmt.Sprintf("loss %.4f", float64(*validationLoss)))
	}
	if validationAccuracy != nil {
		validation = append(validation, fmt.Sprintf("accuracy %.3f", float64(*validationAccuracy)))
	}
	if len(validation) > 0 {
		line += ", validation " + strings.Join(validation, " ")
	}
	return line
}

// eventContract is the x-attune-event-contract header's value: "2" from workers that may put a short job's
// epochs on its terminal event, none (contract 1) from releases before 0.40.
func eventContract(headers amqp.Table) string {
	switch value := headers["x-attune-event-contract"].(type) {
	case nil:
		return "1 (no x-attune-event-contract header)"
	case string:
		return value
	case []byte:
		return string(value)
	default:
		return fmt.Sprint(value)
	}
}

func awaitOutcome(deliveries <-chan amqp.Delivery, o options) int {
	deadline := time.After(o.timeout)
	contractShown := false
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return failed(exitTimeout, "the broker closed the events queue before job %s ended; "+
					"see `attune model history --name %s --user %s`", o.jobID, o.model, o.user)
			}
			var e event
			if err := json.Unmarshal(d.Body, &e); err != nil {
				fmt.Fprintf(os.Stderr, "ignoring an event that is not JSON (%v)\n", err)
				continue
			}
			if e.JobID != o.jobID {
				continue // another job of the same user
			}
			if !contractShown {
				fmt.Printf("event contract %s\n", eventContract(d.Headers))
				contractShown = true
			}
			fmt.Printf("%s %s\n", d.RoutingKey, d.Body)
			// Every epoch's metrics, under either form: an EPOCH_END of its own (a longer job, or a worker
			// started with --events all), or on the terminal event (a job over within --progress-after).
			var p epochs
			if err := json.Unmarshal(d.Body, &p); err != nil {
				fmt.Fprintf(os.Stderr, "cannot read the epochs of this %s event (%v)\n", e.Kind, err)
			} else if e.Kind == "EPOCH_END" {
				fmt.Println(epochLine(o.jobID, p.Epoch, p.Epochs, p.Loss, p.ValidationLoss, p.ValidationAccuracy))
			}
			for _, m := range p.EpochMetrics {
				of := ""
				if e.Kind == "COMPLETED" { // a failed or cancelled job's epochs stop short
					of = strconv.Itoa(len(p.EpochMetrics))
				}
				fmt.Println(epochLine(o.jobID, m.Epoch, of, m.Loss, m.ValidationLoss, m.ValidationAccuracy))
			}
			switch e.Kind {
			case "COMPLETED":
				version := e.Version
				if version == "" {
					version = "0"
				}
				if e.Duplicate {
					fmt.Printf("job %s had already been applied as version %s\n", o.jobID, version)
				} else {
					fmt.Printf("job %s completed: version %s\n", o.jobID, version)
				}
				return exitCompleted
			case "FAILED":
				if e.WillRetry {
					fmt.Printf("job %s failed transiently and will be retried: %s\n", o.jobID, e.Reason)
					continue
				}
				return failed(exitJobFailed, "job %s failed: %s", o.jobID, e.Reason)
			case "CANCELLED":
				reason := e.Reason
				if reason == "" {
					reason = "no reason given"
				}
				return failed(exitJobFailed, "job %s was cancelled (stage %s): %s", o.jobID, e.CancelStage, reason)
			}
		case <-deadline:
			return failed(exitTimeout, "no outcome for job %s within %s: is a worker running (`attune worker`)? "+
				"The job stays queued and is applied when one is", o.jobID, o.timeout)
		}
	}
}

// newUUID is a random (version 4) UUID, which keeps job ids unique across producers.
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		fail(exitUsage, "no randomness for a job id: %v; give --job-id", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func failed(code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "attune-producer: "+format+"\n", args...)
	return code
}

func fail(code int, format string, args ...any) {
	os.Exit(failed(code, format, args...))
}
