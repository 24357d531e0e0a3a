#!/usr/bin/env node
// Stream one generation from an ortserve scheduler. The text goes to stdout;
// the cap (when the KV budget reduced max_new_tokens) and stats go to stderr.
//
//   node generate.js [--address 127.0.0.1:50051] [--cacert ca.pem] [--max-new-tokens N] [--chat] "prompt"
//
// TLS: --cacert (env ORTSERVE_CACERT) names the CA the scheduler's certificate
// chains to. An API key is read from env ORTSERVE_API_KEY (never argv, where
// `ps` shows it) and sent as `authorization: Bearer <key>`.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

function parseArgs(argv) {
  const args = {
    address: process.env.ORTSERVE_ADDRESS || "127.0.0.1:50051", chat: false,
    cacert: process.env.ORTSERVE_CACERT || "",
  };
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--address") args.address = argv[++i];
    else if (argv[i] === "--max-new-tokens") args.maxNewTokens = Number(argv[++i]);
    else if (argv[i] === "--chat") args.chat = true;
    else if (argv[i] === "--cacert") args.cacert = argv[++i];
    else rest.push(argv[i]);
  }
  if (rest.length !== 1) {
    process.stderr.write("usage: node generate.js [--address HOST:PORT] [--cacert CA.pem] [--max-new-tokens N] [--chat] PROMPT\n");
    process.exit(2);
  }
  args.prompt = rest[0];
  return args;
}

const protos = path.resolve(__dirname, "..", "..", "protos");
const definition = protoLoader.loadSync(path.join(protos, "ortserve/v1/scheduler.proto"), {
  includeDirs: [protos],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
});
const { Scheduler } = grpc.loadPackageDefinition(definition).ortserve.v1;

const args = parseArgs(process.argv.slice(2));
const fs = require("fs");
const credentials = args.cacert
  ? grpc.credentials.createSsl(fs.readFileSync(args.cacert))
  : grpc.credentials.createInsecure();
const client = new Scheduler(args.address, credentials);
const metadata = new grpc.Metadata();
if (process.env.ORTSERVE_API_KEY) metadata.set("authorization", `Bearer ${process.env.ORTSERVE_API_KEY}`);
const request = args.chat
  ? { chat: { messages: [{ role: "user", content: args.prompt }] } }
  : { text: args.prompt };
if (args.maxNewTokens !== undefined) request.max_new_tokens = args.maxNewTokens;

function describeCap(cap) {
  return `CAPPED by the KV budget: max_new_tokens ${cap.requested_max_new_tokens} -> ` +
    `${cap.admitted_max_new_tokens} (needs ${cap.requested_bytes} B, ${cap.available_bytes} B free ` +
    `of ${cap.capacity_bytes} B at ${cap.bytes_per_token} B/token on ${cap.worker_id})`;
}

const call = client.Generate(request, metadata);
call.on("data", (event) => {
  if (event.event === "queued") {
    const q = event.queued;
    process.stderr.write(`ortserve-node: queued for KV budget: place ${q.position}, waited ${Math.round(q.waited_ms)} ms\n`);
  } else if (event.event === "admission") {
    if (event.admission.budget_cap) process.stderr.write(`ortserve-node: ${describeCap(event.admission.budget_cap)}\n`);
  } else if (event.event === "chunk") {
    process.stdout.write(event.chunk.text);
  } else if (event.event === "finished") {
    const f = event.finished;
    process.stdout.write("\n");
    process.stderr.write(`ortserve-node: finish_reason=${f.finish_reason} ` +
      `generated_tokens=${f.usage.generated_tokens} max_new_tokens=${f.usage.max_new_tokens}` +
      (f.budget_cap ? ` capped_from=${f.budget_cap.requested_max_new_tokens}` : "") + "\n");
  }
});
call.on("error", (err) => {
  process.stderr.write(`ortserve-node: error [${grpc.status[err.code]}]: ${err.details}\n`);
  process.exitCode = 1;
});
call.on("end", () => client.close());
