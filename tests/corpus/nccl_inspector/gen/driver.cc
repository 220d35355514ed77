// Writes the NCCL Inspector corpus with NCCL's own JSON writer (json.cc, linked by gen.sh from the
// NVIDIA/nccl tag it names), replaying the Inspector's call sequences. Every function below cites the
// code it copies; only the inputs (communicators, timings, clock, hostname, pid) are made up.
//
//   v2.30.7-1 plugins/profiler/inspector/inspector_json.cc
//     inspectorCommInfoHeader l.26-38, inspectorCommInfoMetaHeader l.58-72,
//     inspectorCompletedCollVerbose l.94-137, inspectorCompletedP2pVerbose l.139-182,
//     inspectorCompletedColl l.204-229, inspectorCompletedP2p l.231-258,
//     inspectorCommInfoDumpColl/P2p l.304-323 / l.349-368 (one line per record, header ignored on error)
//   v2.30.7-1 plugins/profiler/inspector/inspector.cc inspectorComputeOpBw l.1450-1492,
//     inspectorCommGetHashStr l.1152-1157 ("0x%lx"), inspectorStateDumpJSON l.652 ("%s/%s-pid%d.log")
//   v2.30.7-1 plugins/profiler/inspector/inspector_plugin.cc l.264-265 (msgSizeBytes = typeSize * count)
//   v2.28.3-1 ext-profiler/inspector/inspector.cc inspectorCommInfoHeader l.335-343 (no comm_name),
//     inspectorCompletedColl l.472-500, inspectorCommInfoDump l.544-556
//
// Output: one <hostname>-pid<pid>.log per scenario in argv[1], and manifest.json: what each file holds,
// tallied here as it is written (the truth the parser's test compares with).
#include "json.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#define JSON_CHK(expr)                        \
  do {                                        \
    if ((expr) != jsonSuccess) return false;  \
  } while (0)

enum Fmt { V228, V230 };

struct Comm {
  uint64_t hash;
  const char* name;  // NULL or "" -> "unknown" (2.30)
  int rank, nranks, nnodes;
  char hashStr[17];
};

struct Kern { uint64_t startSn, stopSn, recordSn, startTs, stopTs, recordTs; };

struct Op {
  bool p2p;
  const char* func;
  uint64_t sn;
  int peer;
  uint64_t msgSize;
  uint64_t execUs;
  const char* timing;
  double algo, bus;
  uint64_t startSn, stopSn, startTs, stopTs;
  std::vector<Kern> k;
};

static Fmt fmt = V230;
static bool verbose = false;
static const char* host = "gpu-a";
static uint64_t pid = 1;
static uint64_t clockUs = 1764700000000000ULL;  // 2025-12-02, the dump thread's gettimeofday()
static uint32_t lcg = 12345;
static double jitter() {  // deterministic noise in [-1, 1)
  lcg = lcg * 1103515245u + 12345u;
  return ((lcg >> 8) & 0xffff) / 32768.0 - 1.0;
}

// inspector.cc v2.30.7-1 l.1450-1492
static void computeBw(const Comm& c, Op& op) {
  double timeInSec = op.execUs / 1000000.0;
  double factor = 0.0, trafficSize = 0.0;
  std::string f = op.func;
  if (op.p2p) {
    trafficSize = (double)op.msgSize;
    factor = 1.0;
  } else if (f == "Reduce" || f == "Broadcast") {
    trafficSize = (double)op.msgSize; factor = 1;
  } else if (f == "AllReduce") {
    trafficSize = (double)op.msgSize;
    factor = ((double)(2 * (c.nranks - 1))) / ((double)c.nranks);
  } else if (f == "ReduceScatter" || f == "AllGather" || f == "AllGatherV") {
    trafficSize = (double)(op.msgSize * c.nranks);  // uint64 product, as in the source
    factor = ((double)(c.nranks - 1)) / ((double)c.nranks);
  } else if (f == "SendRecv" || f == "Send" || f == "Recv") {
    trafficSize = (double)op.msgSize; factor = 1;
  }
  op.algo = timeInSec != 0 ? (trafficSize / 1.0E9 / timeInSec) : 0;
  op.bus = op.algo * factor;
}

static bool header(jsonFileOutput* jfo, const Comm& c) {
  JSON_CHK(jsonStartObject(jfo));
  JSON_CHK(jsonKey(jfo, "id")); JSON_CHK(jsonStr(jfo, c.hashStr));
  if (fmt == V230) {
    const char* commName = (c.name && c.name[0]) ? c.name : "unknown";
    JSON_CHK(jsonKey(jfo, "comm_name")); JSON_CHK(jsonStr(jfo, commName));
  }
  JSON_CHK(jsonKey(jfo, "rank")); JSON_CHK(jsonInt(jfo, c.rank));
  JSON_CHK(jsonKey(jfo, "n_ranks")); JSON_CHK(jsonInt(jfo, c.nranks));
  JSON_CHK(jsonKey(jfo, "nnodes")); JSON_CHK(jsonUint64(jfo, c.nnodes));
  JSON_CHK(jsonFinishObject(jfo));
  return true;
}

static bool meta(jsonFileOutput* jfo) {
  JSON_CHK(jsonStartObject(jfo));
  JSON_CHK(jsonKey(jfo, "inspector_output_format_version")); JSON_CHK(jsonStr(jfo, "v4.0"));
  JSON_CHK(jsonKey(jfo, "git_rev")); JSON_CHK(jsonStr(jfo, fmt == V230 ? "v2.30.7-1" : "v2.28.3-1"));
  JSON_CHK(jsonKey(jfo, "rec_mechanism")); JSON_CHK(jsonStr(jfo, "nccl_profiler_interface"));
  clockUs += 3;  // inspectorGetTime() per record
  JSON_CHK(jsonKey(jfo, "dump_timestamp_us")); JSON_CHK(jsonUint64(jfo, clockUs));
  JSON_CHK(jsonKey(jfo, "hostname")); JSON_CHK(jsonStr(jfo, host));
  JSON_CHK(jsonKey(jfo, "pid")); JSON_CHK(jsonUint64(jfo, pid));
  JSON_CHK(jsonFinishObject(jfo));
  return true;
}

static bool trace(jsonFileOutput* jfo, const Op& op) {
  const char* p = op.p2p ? "p2p" : "coll";
  std::string s0 = std::string(p) + "_start_sn", s1 = std::string(p) + "_stop_sn";
  std::string t0 = std::string(p) + "_start_ts", t1 = std::string(p) + "_stop_ts";
  JSON_CHK(jsonKey(jfo, "event_trace_sn"));
  JSON_CHK(jsonStartObject(jfo));
  JSON_CHK(jsonKey(jfo, s0.c_str())); JSON_CHK(jsonUint64(jfo, op.startSn));
  JSON_CHK(jsonKey(jfo, s1.c_str())); JSON_CHK(jsonUint64(jfo, op.stopSn));
  JSON_CHK(jsonKey(jfo, "kernel_events"));
  JSON_CHK(jsonStartList(jfo));
  for (uint32_t ch = 0; ch < op.k.size(); ch++) {
    JSON_CHK(jsonStartObject(jfo));
    JSON_CHK(jsonKey(jfo, "channel_id")); JSON_CHK(jsonInt(jfo, ch));
    JSON_CHK(jsonKey(jfo, "kernel_start_sn")); JSON_CHK(jsonUint64(jfo, op.k[ch].startSn));
    JSON_CHK(jsonKey(jfo, "kernel_stop_sn")); JSON_CHK(jsonUint64(jfo, op.k[ch].stopSn));
    JSON_CHK(jsonKey(jfo, "kernel_record_sn")); JSON_CHK(jsonUint64(jfo, op.k[ch].recordSn));
    JSON_CHK(jsonFinishObject(jfo));
  }
  JSON_CHK(jsonFinishList(jfo));
  JSON_CHK(jsonFinishObject(jfo));
  JSON_CHK(jsonKey(jfo, "event_trace_ts"));
  JSON_CHK(jsonStartObject(jfo));
  JSON_CHK(jsonKey(jfo, t0.c_str())); JSON_CHK(jsonUint64(jfo, op.startTs));
  JSON_CHK(jsonKey(jfo, t1.c_str())); JSON_CHK(jsonUint64(jfo, op.stopTs));
  JSON_CHK(jsonKey(jfo, "kernel_events"));
  JSON_CHK(jsonStartList(jfo));
  for (uint32_t ch = 0; ch < op.k.size(); ch++) {
    JSON_CHK(jsonStartObject(jfo));
    JSON_CHK(jsonKey(jfo, "channel_id")); JSON_CHK(jsonInt(jfo, ch));
    JSON_CHK(jsonKey(jfo, "kernel_start_ts")); JSON_CHK(jsonUint64(jfo, op.k[ch].startTs));
    JSON_CHK(jsonKey(jfo, "kernel_stop_ts")); JSON_CHK(jsonUint64(jfo, op.k[ch].stopTs));
    JSON_CHK(jsonKey(jfo, "kernel_record_ts")); JSON_CHK(jsonUint64(jfo, op.k[ch].recordTs));
    JSON_CHK(jsonFinishObject(jfo));
  }
  JSON_CHK(jsonFinishList(jfo));
  JSON_CHK(jsonFinishObject(jfo));
  return true;
}

static bool completed(jsonFileOutput* jfo, const Op& op) {
  JSON_CHK(jsonStartObject(jfo));
  if (op.p2p) {
    JSON_CHK(jsonKey(jfo, "p2p")); JSON_CHK(jsonStr(jfo, op.func));
    JSON_CHK(jsonKey(jfo, "p2p_sn")); JSON_CHK(jsonUint64(jfo, op.sn));
    JSON_CHK(jsonKey(jfo, "p2p_peer")); JSON_CHK(jsonInt(jfo, op.peer));
    JSON_CHK(jsonKey(jfo, "p2p_msg_size_bytes")); JSON_CHK(jsonUint64(jfo, op.msgSize));
    JSON_CHK(jsonKey(jfo, "p2p_exec_time_us")); JSON_CHK(jsonUint64(jfo, op.execUs));
    JSON_CHK(jsonKey(jfo, "p2p_timing_source")); JSON_CHK(jsonStr(jfo, op.timing));
    JSON_CHK(jsonKey(jfo, "p2p_algobw_gbs")); JSON_CHK(jsonDouble(jfo, op.algo));
    JSON_CHK(jsonKey(jfo, "p2p_busbw_gbs")); JSON_CHK(jsonDouble(jfo, op.bus));
  } else {
    JSON_CHK(jsonKey(jfo, "coll")); JSON_CHK(jsonStr(jfo, op.func));
    JSON_CHK(jsonKey(jfo, "coll_sn")); JSON_CHK(jsonUint64(jfo, op.sn));
    JSON_CHK(jsonKey(jfo, "coll_msg_size_bytes")); JSON_CHK(jsonUint64(jfo, op.msgSize));
    JSON_CHK(jsonKey(jfo, "coll_exec_time_us")); JSON_CHK(jsonUint64(jfo, op.execUs));
    JSON_CHK(jsonKey(jfo, "coll_timing_source")); JSON_CHK(jsonStr(jfo, op.timing));
    JSON_CHK(jsonKey(jfo, "coll_algobw_gbs")); JSON_CHK(jsonDouble(jfo, op.algo));
    JSON_CHK(jsonKey(jfo, "coll_busbw_gbs")); JSON_CHK(jsonDouble(jfo, op.bus));
  }
  if (verbose && !trace(jfo, op)) return false;
  JSON_CHK(jsonFinishObject(jfo));
  return true;
}

// inspector_json.cc l.308-320 (and 2.28.3 inspector.cc l.544-556): the header's result is not checked
static bool dumpOne(jsonFileOutput* jfo, const Comm& c, const Op& op) {
  JSON_CHK(jsonStartObject(jfo));
  JSON_CHK(jsonKey(jfo, "header"));
  header(jfo, c);
  JSON_CHK(jsonKey(jfo, "metadata"));
  meta(jfo);
  JSON_CHK(jsonKey(jfo, op.p2p ? "p2p_perf" : "coll_perf"));
  if (!completed(jfo, op)) return false;
  JSON_CHK(jsonFinishObject(jfo));
  JSON_CHK(jsonNewline(jfo));
  return true;
}

struct Tally {
  std::string file;
  int records = 0;
  int wrapped = 0, badJson = 0;
  std::vector<std::string> notes;
};
static std::vector<Tally> tallies;
static std::string outdir;

static Comm comm(uint64_t hash, const char* name, int rank, int nranks, int nnodes) {
  Comm c{hash, name, rank, nranks, nnodes, {0}};
  // inspectorCommGetHashStr: a 17-byte buffer (NCCL_COMM_HASH_LENGTH), so a hash of 15-16 hex digits is cut to 14
  snprintf(c.hashStr, sizeof(c.hashStr), "0x%lx", (unsigned long)hash);
  return c;
}

// inspector_plugin.cc l.264-265: typeSize * count; typeSize is -1 for a datatype string the plugin lacks
static uint64_t msgSize(int typeSize, uint64_t count) { return typeSize * count; }

static Op coll(const Comm& c, const char* func, uint64_t sn, uint64_t size, double us, const char* timing = "kernel_gpu") {
  Op op{};
  op.p2p = false; op.func = func; op.sn = sn; op.msgSize = size; op.timing = timing;
  op.execUs = (uint64_t)(us > 0 ? us : 0);
  computeBw(c, op);
  return op;
}

static Op p2p(const Comm& c, const char* func, uint64_t sn, int peer, uint64_t size, double us) {
  Op op{};
  op.p2p = true; op.func = func; op.sn = sn; op.peer = peer; op.msgSize = size; op.timing = "kernel_gpu";
  op.execUs = (uint64_t)us;
  computeBw(c, op);
  return op;
}

static void withTrace(Op& op, int channels) {
  static uint64_t evsn = 1;
  op.startSn = evsn++; op.stopSn = evsn++;
  op.startTs = clockUs - op.execUs - 200; op.stopTs = op.startTs + 5;
  op.k.clear();
  for (int ch = 0; ch < channels; ch++) {
    Kern k;
    k.startSn = evsn++; k.stopSn = evsn++; k.recordSn = evsn++;
    k.startTs = op.startTs + 120 + ch; k.stopTs = k.startTs + op.execUs; k.recordTs = k.stopTs;
    op.k.push_back(k);
  }
}

static jsonFileOutput* open(Tally& t) {
  char path[2048];
  snprintf(path, sizeof(path), "%s/%s-pid%d.log", outdir.c_str(), host, (int)pid);  // inspectorStateDumpJSON
  jsonFileOutput* jfo = nullptr;
  if (jsonInitFileOutput(&jfo, path) != jsonSuccess) { perror(path); exit(1); }
  const char* slash = strrchr(path, '/');
  t.file = slash ? slash + 1 : path;
  return jfo;
}

int main(int argc, char** argv) {
  if (argc != 2) { fprintf(stderr, "usage: %s OUTDIR\n", argv[0]); return 64; }
  outdir = argv[1];
  const uint64_t MiB = 1 << 20;

  {  // A: 2.30.7, two communicators, collectives and P2P, the three timing sources and a sub-µs op
    Tally t; fmt = V230; verbose = false; host = "gpu-a"; pid = 4242;
    jsonFileOutput* jfo = open(t);
    Comm dp = comm(0x7f8c496ae9f661ULL, "", 2, 16, 2);            // no name: "unknown"
    Comm pp = comm(0x1b2c3d4e5f607182ULL, "pp/stage-1", 1, 4, 4);  // '/' is escaped by sanitizeJson
    uint64_t ar = 0, ag = 0, rs = 0, s = 0, r = 0;
    for (int dump = 0; dump < 20; dump++) {
      clockUs += 1000000;  // the dump thread's interval
      // comms are listed newest first (inspectorAddComm pushes at the head): pp, then dp
      for (int i = 0; i < 1; i++) {
        dumpOne(jfo, pp, p2p(pp, "Send", ++s, 2, 16 * MiB, 700 * (1 + 0.05 * jitter()))); t.records++;
        dumpOne(jfo, pp, p2p(pp, "Recv", ++r, 0, 16 * MiB, 710 * (1 + 0.05 * jitter()))); t.records++;
      }
      for (int i = 0; i < 2; i++) {
        dumpOne(jfo, dp, coll(dp, "AllReduce", ++ar, 64 * MiB, 1500 * (1 + 0.04 * jitter()))); t.records++;
      }
      dumpOne(jfo, dp, coll(dp, "AllGather", ++ag, 8 * MiB, 600 * (1 + 0.04 * jitter()))); t.records++;
      dumpOne(jfo, dp, coll(dp, "ReduceScatter", ++rs, 8 * MiB, 610 * (1 + 0.04 * jitter()))); t.records++;
    }
    // NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING=0 keeps CPU-timed ops; a kernel under 1 µs has exec time 0
    dumpOne(jfo, dp, coll(dp, "AllReduce", ++ar, 64 * MiB, 1700, "kernel_cpu")); t.records++;
    dumpOne(jfo, dp, coll(dp, "AllReduce", ++ar, 64 * MiB, 2100, "collective_cpu")); t.records++;
    dumpOne(jfo, dp, coll(dp, "AllReduce", ++ar, 8192, 0)); t.records++;
    jsonFinalizeFileOutput(jfo);
    t.notes.push_back("dp 0x7f8c496ae9f661 rank 2/16: AllReduce 64MiB 40 kernel_gpu + 1 kernel_cpu + 1 collective_cpu,"
                      " AllReduce 8KiB 1 untimed, AllGather 8MiB 20, ReduceScatter 8MiB 20; pp rank 1/4: Send->2 20,"
                      " Recv<-0 20");
    tallies.push_back(t);
  }
  {  // B: 2.30.7 with NCCL_INSPECTOR_DUMP_VERBOSE=1, a fully qualified hostname
    Tally t; fmt = V230; verbose = true; host = "gpu-b.cluster.local"; pid = 7;
    jsonFileOutput* jfo = open(t);
    Comm c = comm(0xe62dedaa97644aULL, "DP Group 0", 4, 8, 1);
    for (int i = 1; i <= 5; i++) {
      clockUs += 500;
      Op op = coll(c, "ReduceScatter", 1230 + i, 2048 * MiB, 41057 * (1 + 0.02 * jitter()));
      withTrace(op, 4);
      dumpOne(jfo, c, op); t.records++;
    }
    for (int i = 1; i <= 3; i++) {
      Op op = p2p(c, "Send", i, 5, 512 * MiB, 1154);
      withTrace(op, 2);
      dumpOne(jfo, c, op); t.records++;
    }
    jsonFinalizeFileOutput(jfo);
    t.notes.push_back("0xe62dedaa97644a rank 4/8 'DP Group 0': ReduceScatter 2GiB 5 with 4-channel traces, Send->5 512MiB 3");
    tallies.push_back(t);
  }
  {  // C: 2.28.3: no comm_name, no p2p_perf; each dump writes the latest completed collective of each comm
    Tally t; fmt = V228; verbose = false; host = "gpu-c"; pid = 31337;
    jsonFileOutput* jfo = open(t);
    Comm c = comm(0x9e7a479f95a66cULL, nullptr, 31, 32, 4);
    uint64_t sn = 100;
    for (int dump = 0; dump < 12; dump++) {
      clockUs += 100000;
      sn += 7;  // sampled: the collectives between two dumps are not written
      dumpOne(jfo, c, coll(c, dump % 2 ? "ReduceScatter" : "AllReduce", sn, dump % 2 ? 65536 : 256 * MiB,
                           dump % 2 ? 110 : 5200 * (1 + 0.03 * jitter()))); t.records++;
    }
    jsonFinalizeFileOutput(jfo);
    t.notes.push_back("0x9e7a479f95a66c rank 31/32: AllReduce 256MiB 6, ReduceScatter 64KiB 6");
    tallies.push_back(t);
  }
  {  // D: an ncclUint8 AllGather: NCCL names the type "Unknown", the plugin's size is -1 * count (2**64 - count)
    Tally t; fmt = V230; verbose = false; host = "gpu-d"; pid = 555;
    jsonFileOutput* jfo = open(t);
    Comm c = comm(0x5b1e0c3f9a7d2e41ULL, "", 0, 8, 1);
    for (int i = 1; i <= 3; i++) {
      clockUs += 1000;
      dumpOne(jfo, c, coll(c, "AllReduce", i, msgSize(2, 16 * MiB), 800)); t.records++;
      dumpOne(jfo, c, coll(c, "AllGather", i, msgSize(-1, 4 * MiB), 300)); t.wrapped++;
    }
    jsonFinalizeFileOutput(jfo);
    t.notes.push_back("AllReduce bf16 32MiB 3 records; AllGather uint8 3 lines with a wrapped size");
    tallies.push_back(t);
  }
  {  // E: a comm name that is not UTF-8: jsonStr fails inside the header, the line is broken, and the
     // next record's jsonStartObject fails with the output lock held: nothing more is ever written
    Tally t; fmt = V230; verbose = false; host = "gpu-e"; pid = 900;
    jsonFileOutput* jfo = open(t);
    Comm a = comm(0xabc123ULL, "tp", 0, 2, 1);
    Comm b = comm(0xdef456ULL, "r\xe9plica", 1, 2, 1);  // Latin-1
    clockUs += 1000;
    dumpOne(jfo, a, coll(a, "AllReduce", 1, 4 * MiB, 90)); t.records++;
    dumpOne(jfo, a, coll(a, "AllReduce", 2, 4 * MiB, 91)); t.records++;
    // the header's error is ignored (l.311): the call succeeds and leaves the outer object open
    if (!dumpOne(jfo, b, coll(b, "AllReduce", 1, 4 * MiB, 92))) { fprintf(stderr, "writer failed early\n"); return 1; }
    t.badJson++;
    if (dumpOne(jfo, b, coll(b, "AllReduce", 2, 4 * MiB, 92))) { fprintf(stderr, "expected the writer stuck\n"); return 1; }
    jsonFinalizeFileOutput(jfo);
    t.notes.push_back("2 AllReduce records of 0xabc123, then one broken line (comm_name without a value) and silence");
    tallies.push_back(t);
  }

  std::string m = outdir + "/manifest.json";
  FILE* f = fopen(m.c_str(), "w");
  fprintf(f, "{\n");
  for (size_t i = 0; i < tallies.size(); i++) {
    const Tally& t = tallies[i];
    fprintf(f, "  \"%s\": {\"records\": %d, \"skips\": {", t.file.c_str(), t.records);
    const char* sep = "";
    if (t.wrapped) { fprintf(f, "\"wrapped_size\": %d", t.wrapped); sep = ", "; }
    if (t.badJson) fprintf(f, "%s\"bad_json\": %d", sep, t.badJson);
    fprintf(f, "}, \"note\": \"%s\"}%s\n", t.notes[0].c_str(), i + 1 < tallies.size() ? "," : "");
  }
  fprintf(f, "}\n");
  fclose(f);
  return 0;
}
