// KafkaJS transactions through raylog's Kafka listener: a committed transaction over two partitions
// with the group's offsets sent to it, an aborted one, a zombie producer fenced by a newer one of the
// same transactional id, then a read_committed KafkaJS consumer reads the topic back.
// Prints JSON lines: {"committed": ...}, {"aborted": ...}, {"fenced": error name}, then {"read": ...} per record.
// argv: brokers (comma separated), user, password, topic, transactional id, group (of the offsets)
const { Kafka, logLevel } = require("kafkajs");

const [brokers, username, password, topic, transactionalId, groupId] = process.argv.slice(2);
const kafka = new Kafka({
  clientId: "raylog-test",
  brokers: brokers.split(","),
  sasl: { mechanism: "scram-sha-256", username, password },
  ssl: false,
  logLevel: logLevel.NOTHING,
});
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

async function main() {
  const producer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();

  const committed = await producer.transaction();
  await committed.send({ topic, messages: [{ partition: 0, key: "k", value: "c-0" }, { partition: 1, value: "c-1" }] });
  await committed.sendOffsets({ consumerGroupId: groupId, topics: [{ topic, partitions: [{ partition: 0, offset: "5" }] }] });
  await committed.commit();
  out({ committed: true });

  const aborted = await producer.transaction();
  await aborted.send({ topic, messages: [{ partition: 0, value: "a-0" }, { partition: 1, value: "a-1" }] });
  await aborted.abort();
  out({ aborted: true });

  // a newer producer of the same transactional id fences the old one
  const open = await producer.transaction();
  await open.send({ topic, messages: [{ partition: 0, value: "zombie" }] });
  const newer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 });
  await newer.connect();
  const last = await newer.transaction(); // InitProducerId of the id: aborts the open one, fences its producer
  let fenced = null;
  try {
    await open.send({ topic, messages: [{ partition: 0, value: "zombie-2" }] });
    await open.commit();
  } catch (err) {
    fenced = err.type || err.name;
  }
  out({ fenced });
  await last.send({ topic, messages: [{ partition: 0, value: "n-0" }] });
  await last.commit();
  await newer.disconnect();
  await producer.disconnect().catch(() => {});

  const consumer = kafka.consumer({ groupId: groupId + "-reader", maxWaitTimeInMs: 200, readUncommitted: false });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  await new Promise((resolve) => {
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        out({ read: message.value.toString(), partition });
        seen += 1;
        if (seen === 3) setTimeout(resolve, 1500); // wait a little: nothing else may come
      },
    });
  });
  await consumer.disconnect();
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
