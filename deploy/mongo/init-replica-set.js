// Initialises the MongoDB replica set `rs0` (mongo-1, mongo-2, mongo-3).
//
// Run once per `docker compose up` by the one-shot `mongo-init` container:
//   mongosh --quiet "mongodb://mongo-1:27017/admin?directConnection=true" /scripts/init-replica-set.js
//
// Idempotent: if the set is already initiated (the volumes survive restarts) it
// only reports the status. Either way it waits until a primary has been elected,
// so that the gpufleet services, which start after this container has exited 0,
// can open transactions straight away. Any failure exits non-zero, which keeps the
// services from starting (depends_on: condition: service_completed_successfully).
//
// Why a replica set at all: the services write their state and their outbox
// events in one multi-document transaction, and MongoDB only allows transactions
// on a replica set (or a sharded cluster), never on a standalone mongod.

const REPLICA_SET = "rs0";
const MEMBERS = [
  // mongo-1 gets a higher priority so that, when all members are healthy, the
  // primary is the one whose port is published to the host (handy for debugging).
  { _id: 0, host: "mongo-1:27017", priority: 2 },
  { _id: 1, host: "mongo-2:27017", priority: 1 },
  { _id: 2, host: "mongo-3:27017", priority: 1 },
];
const PRIMARY_TIMEOUT_MS = 120 * 1000;

const NOT_YET_INITIALIZED = 94;
const ALREADY_INITIALIZED = 23;

// rs.status() throws NotYetInitialized on a fresh member; any other error is real.
function currentStatus() {
  try {
    return rs.status();
  } catch (e) {
    if (e.code === NOT_YET_INITIALIZED || e.codeName === "NotYetInitialized") {
      return null;
    }
    throw e;
  }
}

let status = currentStatus();

if (status === null) {
  print(`replica set ${REPLICA_SET} not initiated yet: initiating with ${MEMBERS.map((m) => m.host).join(", ")}`);
  try {
    rs.initiate({ _id: REPLICA_SET, members: MEMBERS });
  } catch (e) {
    // Another run got there first (e.g. two `up`s racing): that is fine.
    if (e.code !== ALREADY_INITIALIZED && e.codeName !== "AlreadyInitialized") {
      throw e;
    }
    print("replica set was initiated concurrently; continuing");
  }
} else if (status.set !== REPLICA_SET) {
  print(`mongo-1 belongs to replica set "${status.set}", expected "${REPLICA_SET}"`);
  quit(1);
} else {
  print(`replica set ${REPLICA_SET} already initiated; nothing to do`);
}

// Wait for an elected primary.
const deadline = Date.now() + PRIMARY_TIMEOUT_MS;
for (;;) {
  status = currentStatus();
  const primary = status && status.members.find((m) => m.stateStr === "PRIMARY");
  if (primary) {
    const states = status.members.map((m) => `${m.name}=${m.stateStr}`).join(" ");
    print(`replica set ${REPLICA_SET} ready, primary ${primary.name} (${states})`);
    break;
  }
  if (Date.now() > deadline) {
    print(`no primary elected in ${PRIMARY_TIMEOUT_MS / 1000}s: ${tojson(status)}`);
    quit(1);
  }
  sleep(1000);
}
