#!/usr/bin/env node
// The peer of bench/run.sh: graphile-worker with its batching settings, on the benchmark's own
// Postgres cluster. Modes (argv[2]):
//   migrate             install or upgrade graphile-worker's schema, then exit
//   drain N             run a worker until N no-op jobs ran and none is left in the table; print
//                       one JSON object with the timings (CLOCK_MONOTONIC, like the C++ side)
//   latency FILE        run a worker whose no-op task appends "seq monotonic_ns" to FILE, until
//                       SIGTERM (outbox-bench latency --mode peer drives it)
// DATABASE_URL: the benchmark database.
"use strict";
process.env.NO_LOG_SUCCESS = "1"; // as graphile-worker's own perfTest: no log line per job

const fs = require("fs");
const { Client } = require("pg");
const { run, runMigrations, Logger } = require("graphile-worker");

const connectionString = process.env.DATABASE_URL;
if (!connectionString) {
  console.error("worker.js: DATABASE_URL is not set");
  process.exit(2);
}

// The settings under test (issue 2): one worker process, concurrency 10, a pool of 11, a local
// queue of 500 jobs, completions batched with a 0 ms delay.
const preset = {
  worker: {
    connectionString,
    concurrentJobs: 10,
    maxPoolSize: 11,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
};

// Warnings and errors only, on stderr.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[${level}] ${message}`);
});

const now = () => process.hrtime.bigint(); // uv_hrtime: CLOCK_MONOTONIC, in ns
const secondsBetween = (a, b) => Number(b - a) / 1e9;

async function drain(expect) {
  const poll = new Client({ connectionString });
  await poll.connect(); // before t0, like the C++ side's poll connection
  // Jobs are fetched in id order (same priority, same run_at), so the tail of the id range is
  // completed last: a primary-key range probe sees that cheaply, where count(*) would walk every
  // dead row of the drained table. The full count follows after the timing.
  const maxId = (await poll.query("SELECT coalesce(max(id), 0)::int8 AS m FROM graphile_worker._private_jobs")).rows[0].m;
  const tailSql = `SELECT count(*)::int AS n FROM graphile_worker._private_jobs WHERE id > ${BigInt(maxId) - 2000n}`;
  let ran = 0;
  let firstRan = 0n;
  let allRan = 0n;
  let resolveAll;
  const allRanPromise = new Promise((resolve) => (resolveAll = resolve));
  const taskList = {
    noop: async () => {
      ran += 1;
      if (ran === 1) firstRan = now();
      if (ran === expect) {
        allRan = now();
        resolveAll();
      }
    },
  };
  const cpu0 = process.cpuUsage();
  const t0 = now();
  const runner = await run({ preset, taskList, logger, noHandleSignals: true });
  await allRanPromise;
  // Completions are batched: poll until the table is empty, only now (no polling during the run).
  let tDone = 0n;
  for (let i = 0; i < 60000; i++) {
    const { rows } = await poll.query(tailSql);
    if (rows[0].n === 0) {
      tDone = now();
      break;
    }
    await new Promise((r) => setTimeout(r, 1));
  }
  await runner.stop();
  const cpu = process.cpuUsage(cpu0);
  const { rows } = await poll.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs");
  await poll.end();
  const ok = tDone !== 0n && rows[0].n === 0 && ran === expect;
  const out = { events: expect, ran, jobs_left_after: rows[0].n, worker_cpu_seconds: (cpu.user + cpu.system) / 1e6 };
  if (ok) {
    out.seconds = +secondsBetween(t0, tDone).toFixed(4);
    out.rate = +(expect / secondsBetween(t0, tDone)).toFixed(1);
    out.seconds_to_last_task = +secondsBetween(t0, allRan).toFixed(4);
    out.rate_to_last_task = +(expect / secondsBetween(t0, allRan)).toFixed(1);
    out.seconds_to_first_task = +secondsBetween(t0, firstRan).toFixed(4);
  }
  console.log(JSON.stringify(out));
  return ok ? 0 : 1;
}

async function latency(file) {
  const fd = fs.openSync(file, "a");
  const taskList = {
    noop: async (payload) => {
      fs.writeSync(fd, `${payload.seq} ${now()}\n`); // stamp first, then write: the stamp is the figure
    },
  };
  const runner = await run({ preset, taskList, logger, noHandleSignals: true });
  await new Promise((resolve) => {
    process.once("SIGTERM", resolve);
    process.once("SIGINT", resolve);
  });
  await runner.stop();
  fs.closeSync(fd);
  return 0;
}

async function main() {
  const mode = process.argv[2];
  if (mode === "migrate") {
    await runMigrations({ preset, logger });
    return 0;
  }
  if (mode === "drain") return drain(parseInt(process.argv[3], 10));
  if (mode === "latency") return latency(process.argv[3]);
  console.error("usage: worker.js migrate | drain N | latency FILE");
  return 2;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
