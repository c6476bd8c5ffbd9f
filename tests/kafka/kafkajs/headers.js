// Produce records with headers, a tombstone and an empty value through KafkaJS, then
// consume them back with KafkaJS (a consumer group); prints one JSON line per record read.
// argv: brokers (comma separated), user, password, topic, group
const { Kafka, logLevel } = require("kafkajs");

const [brokers, username, password, topic, groupId] = process.argv.slice(2);
const kafka = new Kafka({
  clientId: "raylog-test",
  brokers: brokers.split(","),
  sasl: { mechanism: "scram-sha-256", username, password },
  ssl: false,
  logLevel: logLevel.ERROR,
});

const hex = (b) => (b === null || b === undefined ? null : Buffer.from(b).toString("hex"));

async function main() {
  const producer = kafka.producer();
  await producer.connect();
  const sent = await producer.send({
    topic,
    acks: -1,
    messages: [
      { partition: 0, key: "k1", value: "v1", headers: { h: ["a", "b"], e: "" } },
      { partition: 0, key: "k2", value: null, headers: { t: "x" } },
      { partition: 0, key: null, value: "" },
    ],
  });
  await producer.disconnect();
  process.stdout.write(JSON.stringify({ produced: sent[0].baseOffset }) + "\n");

  const consumer = kafka.consumer({ groupId, maxWaitTimeInMs: 200 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  await new Promise((resolve) => {
    consumer.run({
      eachMessage: async ({ message }) => {
        const headers = [];
        for (const [k, v] of Object.entries(message.headers || {})) {
          for (const one of Array.isArray(v) ? v : [v]) headers.push([k, hex(one)]);
        }
        process.stdout.write(JSON.stringify({ offset: message.offset, key: hex(message.key),
                                              value: hex(message.value), headers }) + "\n");
        seen += 1;
        if (seen === 3) resolve();
      },
    });
  });
  await consumer.disconnect();
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
