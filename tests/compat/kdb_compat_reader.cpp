// kdb_compat_reader DB_PATH [DEVICE_TYPE]: read every row of a kernel DB the way the NNFusion
// compiler does (KernelCacheManager::fetch_all, then the cache emitters' reads of Function) and
// report what would crash it or make a row unreachable. Our own code, written from a description
// of the compiler; the reads keep its order and its types, so the same rows throw the same way.
// Prints `row <rowid> key=<key> <identifier>: <severity>: <reason>` per problem, then `rows=N
// fetched=M crash=C unreachable=U`. Exit 0 if clean, 1 if not, 2 on usage/open/read errors.
#include <sqlite3.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using json = nlohmann::json;

namespace {

// The compiler's SupportOpList: CudaElementOpMap's keys plus the kernels it caches.
const std::set<std::string> kSupportedOps = {
    "Abs", "Acos", "Asin", "Atan", "Ceiling", "Cos", "Cosh", "Erf", "Exp", "Floor", "Log", "Max",
    "Min", "Sin", "Sinh", "Sqrt", "Rsqrt", "Square", "Tan", "Tanh", "Power", "PowerBackwardBase",
    "PowerBackwardExponent", "Subtract", "Divide", "DivNoNan", "Sign", "Convert", "Equal",
    "NotEqual", "Gelu", "Greater", "GreaterEq", "Less", "LessEq", "Relu", "Relu6", "Not",
    "Negative", "Select", "ReluBackprop", "Relu6Backprop", "And", "Or", "Add", "Multiply",
    "Minimum", "Maximum", "Nop", "Sigmoid", "SigmoidBackprop", "Dot", "Convolution", "AvgPool",
    "MaxPool", "Fused_Convolution_Relu", "Fused_Convolution_Add_Relu", "Matched_Pattern"};

// The compiler's query, verbatim: same columns in the same order, so the same scan order too.
const char* kFetchSql =
    "SELECT Key, Identifier, OpType, Attributes, Source, DeviceType, Function, Tags, Miscs "
    "FROM KernelCache WHERE (Identifier = ?) AND (DeviceType = ?);";
const char* kColumns[] = {"Key", "Identifier", "OpType", "Attributes", "Source", "DeviceType",
                          "Function", "Tags", "Miscs"};

struct Entry {  // what fetch_all builds for one row
  std::string key, identifier, op_type, source, device_type;
  json attributes, function, miscs;
  std::set<std::string> tags;
  std::map<std::string, float> profile;
  int resource = 0;
};

struct Label { std::string rowid, key, identifier; };  // how a row is named in the report

// The compiler does std::string((char*)sqlite3_column_text(...)): UB (a crash) on NULL, and it
// stops at the first NUL byte. Check first, then build the string the same way.
std::string text(sqlite3_stmt* st, int col) {
  const unsigned char* p = sqlite3_column_text(st, col);
  if (!p) throw std::runtime_error(std::string("NULL column ") + kColumns[col]);
  return std::string(reinterpret_cast<const char*>(p));
}

// A column as text, or `null_as` for NULL (for labels and bookkeeping, not the compiler's reads).
std::string text_or(sqlite3_stmt* st, int col, const char* null_as) {
  const unsigned char* p = sqlite3_column_text(st, col);
  return p ? std::string(reinterpret_cast<const char*>(p)) : std::string(null_as);
}

struct Reader {
  sqlite3* db = nullptr;
  std::string device;
  std::map<std::string, long long> rowid_of_key;  // Key is the PRIMARY KEY (NOT NULL) in the DDL
  std::set<long long> seen;                       // rows some fetch stepped onto
  long long fetched = 0, crash = 0, unreachable = 0;

  void report(const Label& l, const char* severity, const std::string& why) {
    std::cout << "row " << l.rowid << " key=" << l.key.substr(0, 20) << " "
              << l.identifier.substr(0, 60) << ": " << severity << ": " << why << "\n";
    crash += std::string(severity) == "crash";
    unreachable += std::string(severity) == "unreachable";
  }

  // Name the fetched row (rowid through its Key) and mark it seen.
  Label label_of(sqlite3_stmt* st) {
    Label l{"?", text_or(st, 0, "(NULL)"), text_or(st, 1, "(NULL)")};
    auto it = sqlite3_column_type(st, 0) == SQLITE_NULL ? rowid_of_key.end()
                                                         : rowid_of_key.find(l.key);
    if (it != rowid_of_key.end()) {
      seen.insert(it->second);
      l.rowid = std::to_string(it->second);
    }
    return l;
  }

  void fetch(const std::string& identifier);
};

// std::stof's own what() is just "stof"; say which text it choked on.
float stof_checked(const std::string& s) {
  try {
    return std::stof(s);
  } catch (const std::logic_error& ex) {  // std::invalid_argument or std::out_of_range
    bool range = dynamic_cast<const std::out_of_range*>(&ex) != nullptr;
    throw std::runtime_error("std::stof(\"" + s + "\") throws std::" +
                             (range ? "out_of_range" : "invalid_argument"));
  }
}

// fetch_all's profile parsing. Works on a copy with operator[] like the compiler, so a missing
// key becomes null and the conversion throws type_error.
void read_profile(Entry& e, std::string& stage) {
  if (e.miscs.find("external_profile") == e.miscs.end()) return;
  json miscs = e.miscs;
  stage = "Miscs.external_profile.time";
  std::string t = miscs["external_profile"]["time"].get<std::string>();
  size_t pos;
  while ((pos = t.find(';')) != std::string::npos) {
    size_t subpos = t.find(':');
    // Length `pos`, not `pos - subpos - 1`, as in the compiler (stof ignores trailing text).
    e.profile[t.substr(0, subpos)] = stof_checked(t.substr(subpos + 1, pos));
    t.erase(0, pos + 1);
  }
  stage = "Miscs.external_profile.resource";
  e.resource = miscs["external_profile"]["resource"].get<int>();
}

// The emitters' reads of Function, in their order and with the types they convert to.
void emitter_reads(const Entry& e, std::string& stage) {
  bool block = e.tags.count("BlockCudaEmitter") > 0;
  // Kernel selection hands External rows to CacheBlockCudaEmitter after this CHECK.
  stage = "Tags";
  if (e.source == "External" && !block)
    throw std::runtime_error("CHECK failed: Source External without tag BlockCudaEmitter");
  json f = e.function;  // the emitters index a copy with operator[]; same throws
  stage = "Function";   // the emitter's constructor CHECKs this
  if (f.is_null()) throw std::runtime_error("CHECK failed: Function is JSON null");
  stage = "Function.function_signature";
  f["function_signature"].get<std::string>();
  stage = "Function.function_body";  // CacheCudaEmitter's body
  f["function_body"].get<std::string>();
  for (const char* dim : {"grid_dim", "block_dim"}) {  // dim3(f[d][0], f[d][1], f[d][2])
    stage = std::string("Function.") + dim;
    for (int i = 0; i < 3; ++i) f[dim][i].get<unsigned>();
  }
  if (!block) return;
  // CacheBlockCudaEmitter::emit_function_body.
  stage = "Function.shared_memory";
  if (f.find("shared_memory") == f.end()) throw std::runtime_error("CHECK failed: no such key");
  json& sm = f["shared_memory"];
  if (sm.size() > 0) {
    // The loop runs over symbol's length: a shorter dtype/size grows with nulls and throws,
    // a longer one is ignored.
    for (size_t i = 0; i < sm["symbol"].size(); ++i) {
      stage = "Function.shared_memory[" + std::to_string(i) + "]";
      sm["symbol"][i].get<std::string>();
      sm["dtype"][i].get<std::string>();
      sm["size"][i].get<size_t>();
    }
  }
  stage = "Function.num_syncthreads";
  if (f.find("num_syncthreads") == f.end()) throw std::runtime_error("CHECK failed: no such key");
  f["num_syncthreads"].get<int>();
  stage = "Function.block_function_body";
  f["block_function_body"].get<std::string>();
}

void Reader::fetch(const std::string& identifier) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare(db, kFetchSql, -1, &st, nullptr) != SQLITE_OK)
    throw std::runtime_error(std::string("cannot prepare the fetch: ") + sqlite3_errmsg(db));
  sqlite3_bind_text(st, 1, identifier.data(), static_cast<int>(identifier.size()), SQLITE_STATIC);
  sqlite3_bind_text(st, 2, device.data(), static_cast<int>(device.size()), SQLITE_STATIC);

  std::vector<std::pair<Label, Entry>> rows;  // what fetch_all would return
  std::optional<Label> dropper;               // a row whose OpType empties the whole fetch
  while (sqlite3_step(st) == SQLITE_ROW) {
    Label l = label_of(st);
    Entry e;
    std::string stage;
    try {
      // fetch_all's order: text columns and JSON parses first, then the OpType check.
      stage = "Key";        e.key = text(st, 0);
      stage = "Identifier"; e.identifier = text(st, 1);
      stage = "OpType";     e.op_type = text(st, 2);
      stage = "Attributes"; e.attributes = json::parse(text(st, 3));
      stage = "Source";     e.source = text(st, 4);
      stage = "DeviceType"; e.device_type = text(st, 5);
      stage = "Function";   e.function = json::parse(text(st, 6));
      stage = "Miscs";      e.miscs = json::parse(text(st, 8));
      if (!kSupportedOps.count(e.op_type)) {  // the compiler clears the result and stops reading
        dropper = l;
        report(l, "unreachable", "OpType '" + e.op_type + "' is not supported: the compiler "
                                 "drops every row of this identifier");
        break;
      }
      stage = "Tags";  // split on ',' into a set
      std::string tags = text(st, 7);
      for (size_t pos; (pos = tags.find(',')) != std::string::npos; tags.erase(0, pos + 1))
        e.tags.insert(tags.substr(0, pos));
      if (!tags.empty()) e.tags.insert(tags);
      read_profile(e, stage);
      rows.emplace_back(l, std::move(e));
    } catch (const std::exception& ex) {
      report(l, "crash", stage + ": " + ex.what());
    }
  }
  if (dropper) {
    std::string why = "fetch emptied by unsupported OpType in row " + dropper->rowid;
    for (auto& r : rows) report(r.first, "unreachable", why);
    while (sqlite3_step(st) == SQLITE_ROW)
      report(label_of(st), "unreachable", why + " (never read)");
  }
  // The compiler CHECKs finalize: a step that failed (corrupt file, lock) would crash it.
  if (sqlite3_finalize(st) != SQLITE_OK)
    throw std::runtime_error(std::string("fetch failed: ") + sqlite3_errmsg(db));
  if (dropper) return;
  fetched += static_cast<long long>(rows.size());
  for (auto& r : rows) {
    std::string stage;
    try {
      emitter_reads(r.second, stage);
    } catch (const std::exception& ex) {
      report(r.first, "crash", stage + ": " + ex.what());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: " << argv[0] << " DB_PATH [DEVICE_TYPE]  (default CUDA_GPU)\n";
    return 2;
  }
  Reader r;
  r.device = argc == 3 ? argv[2] : "CUDA_GPU";
  auto fail = [&](const std::string& what) {
    std::cerr << argv[1] << ": " << what << "\n";
    sqlite3_close(r.db);
    return 2;
  };
  if (sqlite3_open_v2(argv[1], &r.db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK)
    return fail(std::string("cannot open: ") + sqlite3_errmsg(r.db));
  // Every row, for the totals and to find rows no fetch ever returns.
  struct Row { long long rowid; bool has_key; std::string key, identifier, device; };
  std::vector<Row> all;
  std::set<std::pair<std::string, std::string>> pairs;
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(r.db, "SELECT rowid, Key, Identifier, DeviceType FROM KernelCache", -1,
                         &st, nullptr) != SQLITE_OK)
    return fail(std::string("cannot read KernelCache: ") + sqlite3_errmsg(r.db));
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    Row row{sqlite3_column_int64(st, 0), sqlite3_column_type(st, 1) != SQLITE_NULL,
            text_or(st, 1, ""), text_or(st, 2, ""), text_or(st, 3, "")};
    if (row.has_key) r.rowid_of_key[row.key] = row.rowid;
    // The compiler only ever asks for a real identifier; NULL ones are caught below.
    if (sqlite3_column_type(st, 2) != SQLITE_NULL) pairs.emplace(row.identifier, row.device);
    all.push_back(std::move(row));
  }
  std::string error = rc == SQLITE_DONE ? "" : sqlite3_errmsg(r.db);
  sqlite3_finalize(st);
  if (!error.empty()) return fail("cannot read KernelCache: " + error);

  try {  // every (Identifier, DeviceType) pair of our device, as the compiler would ask
    for (auto& p : pairs)
      if (p.second == r.device) r.fetch(p.first);
  } catch (const std::exception& ex) {
    return fail(ex.what());
  }
  long long other_device = 0;
  for (auto& row : all) {
    if (row.device != r.device) { ++other_device; continue; }
    if (row.has_key && !r.seen.count(row.rowid))  // e.g. NULL or BLOB Identifier/DeviceType
      r.report({std::to_string(row.rowid), row.key, row.identifier}, "unreachable",
               "no fetch for (Identifier, DeviceType) returns this row");
  }
  sqlite3_close(r.db);
  if (other_device)
    std::cout << "note: " << other_device << " rows have a DeviceType other than " << r.device
              << " and were not read\n";
  std::cout << "rows=" << all.size() << " fetched=" << r.fetched << " crash=" << r.crash
            << " unreachable=" << r.unreachable << "\n";
  return r.crash == 0 && r.unreachable == 0 ? 0 : 1;
}
