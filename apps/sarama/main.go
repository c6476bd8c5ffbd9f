// A Kafka client in Go on sarama (Debian's golang-github-shopify-sarama-dev),
// run against raylog's Kafka listeners by tests/kafka/test_kafka_sarama.py.
//
// Usage: sarama-client produce|consume|group  (settings from the environment)
//
//	KAFKA_BROKERS   host:port[,host:port...]
//	KAFKA_USER      the cluster's name (SASL/SCRAM-SHA-256; empty: no SASL)
//	KAFKA_PASSWORD  the cluster's token
//	TOPIC           the topic
//	COUNT           how many messages to produce, or to read before stopping
//	GROUP           the consumer group (group)
//	COMPRESSION     none, gzip, snappy, lz4 or zstd (produce; default none)
//
// produce: COUNT messages to partition 0 by a SyncProducer (acks=all), keys
// "k<i>", values "v<i>" (every fifth a null value), each with the headers
// trace=<i> and kind=go; prints one JSON line per message with its offset.
// consume: reads partition 0 from the oldest offset until COUNT messages;
// prints one JSON line per message (offset, key, value or null, headers).
// group: joins GROUP, reads COUNT messages of TOPIC, marks and commits them,
// prints one JSON line per message and leaves.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"hash"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Shopify/sarama"
	"github.com/xdg-go/scram"
)

type scramClient struct {
	*scram.Client
	*scram.ClientConversation
	scram.HashGeneratorFcn
}

func (x *scramClient) Begin(user, password, authzID string) (err error) {
	x.Client, err = x.HashGeneratorFcn.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	x.ClientConversation = x.Client.NewConversation()
	return nil
}

func (x *scramClient) Step(challenge string) (string, error) { return x.ClientConversation.Step(challenge) }
func (x *scramClient) Done() bool                             { return x.ClientConversation.Done() }

var sha256Gen scram.HashGeneratorFcn = func() hash.Hash { return sha256.New() }

type line struct {
	Offset    int64             `json:"offset"`
	Partition int32             `json:"partition"`
	Key       *string           `json:"key"`
	Value     *string           `json:"value"`
	Headers   map[string]string `json:"headers"`
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func config() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_1_0_0 // record batches with headers, idempotence-capable requests
	c.ClientID = "raylog-sarama-test"
	c.Metadata.Retry.Max = 20
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	if user := os.Getenv("KAFKA_USER"); user != "" {
		c.Net.SASL.Enable = true
		c.Net.SASL.Handshake = true
		c.Net.SASL.User = user
		c.Net.SASL.Password = os.Getenv("KAFKA_PASSWORD")
		c.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
		c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient {
			return &scramClient{HashGeneratorFcn: sha256Gen}
		}
	}
	return c
}

func text(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

func emit(m *sarama.ConsumerMessage) {
	h := map[string]string{}
	for _, r := range m.Headers {
		h[string(r.Key)] = string(r.Value)
	}
	out, _ := json.Marshal(line{m.Offset, m.Partition, text(m.Key), text(m.Value), h})
	fmt.Println(string(out))
}

func main() {
	if len(os.Args) != 2 {
		fail("usage: sarama-client produce|consume|group")
	}
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	topic := os.Getenv("TOPIC")
	count, err := strconv.Atoi(os.Getenv("COUNT"))
	if err != nil || count < 1 {
		fail("COUNT must be a positive number")
	}
	c := config()
	switch os.Args[1] {
	case "produce":
		c.Producer.RequiredAcks = sarama.WaitForAll
		c.Producer.Return.Successes = true
		c.Producer.Partitioner = sarama.NewManualPartitioner
		switch os.Getenv("COMPRESSION") {
		case "gzip":
			c.Producer.Compression = sarama.CompressionGZIP
		case "snappy":
			c.Producer.Compression = sarama.CompressionSnappy
		case "lz4":
			c.Producer.Compression = sarama.CompressionLZ4
		case "zstd":
			c.Producer.Compression = sarama.CompressionZSTD
		}
		producer, err := sarama.NewSyncProducer(brokers, c)
		if err != nil {
			fail("producer: %v", err)
		}
		for i := 0; i < count; i++ {
			msg := &sarama.ProducerMessage{Topic: topic, Partition: 0, Key: sarama.StringEncoder(fmt.Sprintf("k%d", i)),
				Headers: []sarama.RecordHeader{{Key: []byte("trace"), Value: []byte(strconv.Itoa(i))},
					{Key: []byte("kind"), Value: []byte("go")}}}
			if i%5 != 4 {
				msg.Value = sarama.StringEncoder(fmt.Sprintf("v%d", i))
			}
			partition, offset, err := producer.SendMessage(msg)
			if err != nil {
				fail("send %d: %v", i, err)
			}
			out, _ := json.Marshal(map[string]int64{"partition": int64(partition), "offset": offset})
			fmt.Println(string(out))
		}
		if err := producer.Close(); err != nil {
			fail("close: %v", err)
		}
	case "consume":
		consumer, err := sarama.NewConsumer(brokers, c)
		if err != nil {
			fail("consumer: %v", err)
		}
		pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
		if err != nil {
			fail("consume partition: %v", err)
		}
		deadline := time.After(60 * time.Second)
		for seen := 0; seen < count; seen++ {
			select {
			case m := <-pc.Messages():
				emit(m)
			case e := <-pc.Errors():
				fail("consume: %v", e)
			case <-deadline:
				fail("only %d of %d messages within 60 s", seen, count)
			}
		}
		pc.Close()
		consumer.Close()
	case "group":
		c.Consumer.Offsets.Initial = sarama.OffsetOldest
		c.Consumer.Return.Errors = true
		group, err := sarama.NewConsumerGroup(brokers, os.Getenv("GROUP"), c)
		if err != nil {
			fail("group: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		h := &handler{want: count, done: make(chan struct{})}
		go func() {
			for err := range group.Errors() {
				fmt.Fprintf(os.Stderr, "group error: %v\n", err)
			}
		}()
		for ctx.Err() == nil && !h.finished() {
			if err := group.Consume(ctx, []string{topic}, h); err != nil {
				fail("consume: %v", err)
			}
		}
		if !h.finished() {
			fail("only %d of %d messages within 90 s", h.seen, count)
		}
		if err := group.Close(); err != nil {
			fail("close: %v", err)
		}
	default:
		fail("unknown command %q", os.Args[1])
	}
}

type handler struct {
	want, seen int
	done       chan struct{}
}

func (h *handler) finished() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *handler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		emit(m)
		s.MarkMessage(m, "")
		h.seen++
		if h.seen >= h.want {
			close(h.done)
			return nil
		}
	}
	return nil
}
