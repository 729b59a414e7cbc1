// The words and tables of `ringattn lab`: the two-rank, five-position worked example, printed by
// rank 0 from the data runtime::run_lab gathers.
#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <string>

#include "lab_text.hpp"
#include "ringattn/runtime/paths.hpp"

namespace ringattn::app {

using core::Index;

namespace {

using core::Shape;
using runtime::LabEvent;
using runtime::LabEventKind;
using runtime::LabLayer;
using runtime::LabResult;
using runtime::LabRow;

using runtime::join;


// Columns sized to their widest cell: left-aligned text.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : rows_{std::move(header)} {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void append(std::string cell) { rows_.back().push_back(std::move(cell)); }  // one more cell on the last row
  void print(const char* indent = "  ") const {
    std::vector<std::size_t> w(rows_.front().size(), 0);
    for (const auto& r : rows_)
      for (std::size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
    for (std::size_t k = 0; k < rows_.size(); ++k) {
      std::string line = indent;
      for (std::size_t c = 0; c < rows_[k].size(); ++c)
        line += fmt::format("{:<{}}", rows_[k][c], c + 1 < rows_[k].size() ? w[c] + 2 : 0);
      while (!line.empty() && line.back() == ' ') line.pop_back();
      fmt::print("{}\n", line);
      if (k == 0) {
        std::size_t total = 0;
        for (std::size_t c = 0; c < w.size(); ++c) total += w[c] + (c + 1 < w.size() ? 2 : 0);
        fmt::print("{}{}\n", indent, std::string(total, '-'));
      }
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string num(double x) { return fmt::format("{:+.6f}", x); }

std::string vec(const double* x, Index n) {
  std::string s = "[";
  for (Index d = 0; d < n; ++d) s += (d ? ", " : "") + num(x[d]);
  return s + "]";
}

std::string positions_of(const core::Layout& l, int r) {
  const auto pos = l.positions(r);
  return pos.empty() ? std::string("none") : join(pos);
}

std::string block_of(const core::Layout& l, int owner) {
  return fmt::format("K/V of r{} (keys {})", owner, positions_of(l, owner));
}

void print_summary(const LabResult& res) {
  const Shape& s = res.in.shape;
  const core::Layout& l = res.layout;
  const int N = l.ranks();
  const io::CheckReport& ck = *res.report.check;
  fmt::print("ringattn lab: the two-rank, five-position worked example, {} float64 on N={} ranks, dout = {}\n",
             s.str(), N,
             res.layer ? fmt::format("dY Wo^T with dY = G/{}", s.B * s.S)
             : res.in.g.empty() ? std::string("dout.npy") : fmt::format("G/{}", s.B * s.S));
  std::string owners;
  for (int r = 0; r < N; ++r) owners += fmt::format("{}rank {}: positions {}", r ? "; " : "", r, positions_of(l, r));
  auto item = [](const char* what, const std::string& text) { fmt::print("  {:<24}{}\n", what, text); };
  item("partition", fmt::format("{} ({})", join(l.sizes()), owners));
  item("largest block", fmt::format("{} positions = {} elements of K and V", l.max_size(),
                                    2 * s.B * s.HKV * s.D * l.max_size()));
  item("visibility", fmt::format("{} on global positions (local indices only address storage)", res.mask.describe()));
  item("compute path", "ring over MPI: online-softmax forward, K/V replay backward, dK/dV returned to the owner");
  item("", res.traffic == core::Traffic::full
               ? "traffic full: every block is sent, the causally empty ones too (the teaching protocol)"
               : "traffic skip-empty: every K/V block is sent, all-zero dK/dV contributions are not");
  item("output vs reference", fmt::format("max |O - O_ref| {:.2e}   max |LSE - LSE_ref| {:.2e}", res.diff.o,
                                          res.diff.lse));
  item("gradients vs reference", fmt::format("max |dQ - ref| {:.2e}   max |dK - ref| {:.2e}   max |dV - ref| {:.2e}",
                                             res.diff.dq, res.diff.dk, res.diff.dv));
  item("loss / reference loss", fmt::format("{:.17g} / {:.17g} (sum dout . O)", res.loss, res.ref.loss));
  if (res.layer) {
    const LabLayer& ly = *res.layer;
    item("layer", fmt::format("M={}: q,k,v = X Wq, X Wk, X Wv; Y = O Wo; dout = dY Wo^T; weight gradients summed "
                              "over ranks in rank order", ly.M));
    item("layer vs reference", fmt::format("max rel err y {:.2e} dx {:.2e} dWq {:.2e} dWk {:.2e} dWv {:.2e} dWo {:.2e}",
                                           ly.err[0], ly.err[1], ly.err[2], ly.err[3], ly.err[4], ly.err[5]));
    item("", fmt::format("summed weight gradients bitwise identical on every rank: {}",
                         ly.same_bits_on_every_rank ? "yes" : "NO"));
  }
  double worst = 0;
  for (const auto& [name, e] : ck.errors) worst = std::max(worst, e);
  if (res.layer)
    for (double e : res.layer->err) worst = std::max(worst, e);
  item("check", fmt::format("max relative error {:.2e} (tolerance {:.0e}): {}", worst, ck.tolerance,
                            ck.passed ? "PASSED" : "FAILED"));
}

// Label of a row: the position, with batch and head when there is more than one.
std::string row_label(const Shape& s, char kind, const LabRow& r, Index heads) {
  std::string lab;
  if (s.B > 1) lab += fmt::format("b{} ", r.b);
  if (heads > 1) lab += fmt::format("h{} ", r.head);
  return lab + fmt::format("{}{}", kind, r.pos);
}

void print_inputs(const LabResult& res) {
  const Shape& s = res.in.shape;
  const Index qi = s.H * s.D, ki = s.HKV * s.D;
  const bool g = !res.in.g.empty();
  fmt::print("\ninputs (global positions; every value the reference recomputes from){}\n",
             res.layer ? std::string(" of the attention: q, k, v = X Wq, X Wk, X Wv and dout = dY Wo^T")
             : g       ? fmt::format(", dout = G/{}", s.B * s.S)
                       : std::string());
  std::vector<std::string> head = {"position", "rank", "q", "k", "v"};
  if (g) head.push_back("G");
  head.push_back("dout");
  TextTable t(head);
  for (Index b = 0; b < s.B; ++b)
    for (Index p = 0; p < s.S; ++p) {
      const Index qo = (b * s.S + p) * qi, ko = (b * s.S + p) * ki;
      std::vector<std::string> row = {s.B > 1 ? fmt::format("b{} {}", b, p) : std::to_string(p),
                                      fmt::format("r{}", res.layout.owner(p)), vec(&res.in.q[qo], qi),
                                      vec(&res.in.k[ko], ki), vec(&res.in.v[ko], ki)};
      if (g) row.push_back(vec(&res.in.g[qo], qi));
      row.push_back(vec(&res.in.dout[qo], qi));
      t.row(row);
    }
  t.print();
}

void print_events(const LabResult& res) {
  const Shape& s = res.in.shape;
  const core::Layout& l = res.layout;
  const Index D = s.D;
  fmt::print("\nevents (in step order; each on the rank that performed it; forward rows show the state after "
             "the block)\n");
  TextTable t({"#", "rank", "pass", "step", "event", "object", "row", "visible keys / target", "running max m / dK",
               "exp-sum l", "prefix output a/l / dV"});
  int n = 0;
  for (const LabEvent& e : res.events) {
    const std::vector<std::string> lead = {std::to_string(++n), fmt::format("r{}", e.rank),
                                           e.kind == LabEventKind::forward_block ? "fwd" : "bwd",
                                           std::to_string(e.step)};
    auto line = [&](bool first, std::vector<std::string> rest) {
      std::vector<std::string> row = first ? lead : std::vector<std::string>(lead.size());
      row.insert(row.end(), rest.begin(), rest.end());
      t.row(row);
    };
    switch (e.kind) {
      case LabEventKind::forward_block: {
        if (e.rows.empty()) line(true, {"attend block", block_of(l, e.peer), "(no query rows)"});
        for (std::size_t k = 0; k < e.rows.size(); ++k) {
          const LabRow& r = e.rows[k];
          std::vector<Index> vis;
          for (Index j : l.positions(e.peer))
            if (res.mask.visible(r.pos, j)) vis.push_back(j);
          const double m = r.x[0], lsum = r.x[1];
          std::vector<double> prefix(D, 0.0);  // a / l, once some key has been seen
          if (lsum > 0)
            for (Index d = 0; d < D; ++d) prefix[d] = r.x[2 + d] / lsum;
          line(k == 0, {k == 0 ? "attend block" : "", k == 0 ? block_of(l, e.peer) : "",
                        row_label(s, 'q', r, s.H), vis.empty() ? "none: state kept" : fmt::format("k{}", join(vis, " k")),
                        num(m), num(lsum), lsum > 0 ? vec(prefix.data(), D) : "(no key yet)"});
        }
        break;
      }
      case LabEventKind::replay_block: {
        const auto qpos = l.positions(e.rank);
        if (e.rows.empty()) line(true, {"replay block", block_of(l, e.peer), "(no keys)"});
        for (std::size_t k = 0; k < e.rows.size(); ++k) {
          const LabRow& r = e.rows[k];
          std::vector<Index> seen;
          for (Index i : qpos)
            if (res.mask.visible(i, r.pos)) seen.push_back(i);
          line(k == 0, {k == 0 ? "replay block" : "", k == 0 ? block_of(l, e.peer) : "",
                        row_label(s, 'k', r, s.HKV), seen.empty() ? "seen by no query" : fmt::format("seen by q{}", join(seen, " q")),
                        vec(r.x.data(), D), "", vec(r.x.data() + D, D)});
        }
        break;
      }
      case LabEventKind::grad_sent:
        line(true, {"return dK/dV", fmt::format("contribution to r{}'s block", e.peer), "",
                    fmt::format("to r{}: {} elems = {} B", e.peer, e.elems, 8 * e.elems)});
        break;
      case LabEventKind::grad_received:
        line(true, {"receive dK/dV", fmt::format("contribution to r{}'s block", e.rank), "",
                    fmt::format("from r{}: {} elems = {} B, {}", e.peer, e.elems, 8 * e.elems,
                                e.dropped ? "DROPPED (test hook)" : "added")});
        break;
    }
  }
  t.print();
}

void print_final(const LabResult& res) {
  const Shape& s = res.in.shape;
  const Index qi = s.H * s.D, ki = s.HKV * s.D;
  fmt::print("\nfinal outputs and gradients per position, with the dense float64 reference\n");
  TextTable t({"position", "rank", "output O", "reference O", "dQ", "dK", "dV"});
  for (Index b = 0; b < s.B; ++b)
    for (Index p = 0; p < s.S; ++p) {
      const Index qo = (b * s.S + p) * qi, ko = (b * s.S + p) * ki;
      t.row({s.B > 1 ? fmt::format("b{} {}", b, p) : std::to_string(p), fmt::format("r{}", res.layout.owner(p)),
             vec(&res.o[qo], qi), vec(&res.ref.o[qo], qi), vec(&res.dq[qo], qi), vec(&res.dk[ko], ki),
             vec(&res.dv[ko], ki)});
    }
  t.print();
}

std::string matrix(const std::vector<double>& w, Index rows, Index cols) {
  std::string out;
  for (Index i = 0; i < rows; ++i) {
    if (i) out += ' ';
    out += vec(&w[i * cols], cols);
  }
  return out;
}

// --layer: the weights, the layer's outputs per position and the weight gradients: each rank's
// partial over its own positions, their sum as every rank holds it, and the reference.
void print_layer(const LabResult& res) {
  const LabLayer& ly = *res.layer;
  const Shape& s = res.in.shape;
  const Index M = ly.M, HD = s.H * s.D, KD = s.HKV * s.D;
  fmt::print("\nlayer weights (rows of each matrix; every rank holds them whole)\n");
  TextTable w({"Wq [M, H*D]", "Wk [M, HKV*D]", "Wv [M, HKV*D]", "Wo [H*D, M]"});
  w.row({matrix(ly.in.wq, M, HD), matrix(ly.in.wk, M, KD), matrix(ly.in.wv, M, KD), matrix(ly.in.wo, HD, M)});
  w.print();
  fmt::print("\nlayer per position: x and dY in, Y = O Wo and dX = dQ Wq^T + dK Wk^T + dV Wv^T out, with the dense "
             "float64 layer\n");
  TextTable t({"position", "rank", "x", "dY", "Y", "reference Y", "dX", "reference dX"});
  for (Index b = 0; b < s.B; ++b)
    for (Index p = 0; p < s.S; ++p) {
      const Index o = (b * s.S + p) * M;
      t.row({s.B > 1 ? fmt::format("b{} {}", b, p) : std::to_string(p), fmt::format("r{}", res.layout.owner(p)),
             vec(&ly.in.x[o], M), vec(&ly.in.dy[o], M), vec(&ly.y[o], M), vec(&ly.ref.y[o], M), vec(&ly.dx[o], M),
             vec(&ly.ref.dx[o], M)});
    }
  t.print();
  fmt::print("\nweight gradients: each rank's partial over its own positions, summed (not averaged: the ranks\n"
             "split one sequence) in rank order by the all-reduce, and the reference\n");
  const char* names[4] = {"dWq = X^T dQ", "dWk = X^T dK", "dWv = X^T dV", "dWo = O^T dY"};
  const std::vector<double>* ref[4] = {&ly.ref.dwq, &ly.ref.dwk, &ly.ref.dwv, &ly.ref.dwo};
  const Index rows[4] = {M, M, M, HD}, cols[4] = {HD, KD, KD, M};
  std::vector<std::string> head = {"gradient"};
  for (int q = 0; q < res.layout.ranks(); ++q) head.push_back(fmt::format("rank {} partial", q));
  head.insert(head.end(), {"sum (every rank)", "reference"});
  TextTable g(head);
  for (int k = 0; k < 4; ++k) {
    std::vector<std::string> row = {names[k]};
    for (const auto& part : ly.partial[k]) row.push_back(matrix(part, rows[k], cols[k]));
    row.push_back(matrix(ly.dw[k], rows[k], cols[k]));
    row.push_back(matrix(*ref[k], rows[k], cols[k]));
    g.row(row);
  }
  g.print();
}

void print_ledger(const LabResult& res) {
  fmt::print("\nledger per rank (elements that moved; 8 B each in float64)\n");
  std::vector<std::string> head = {"rank", "positions", "send fwd KV / replay KV / grad",
                                   "recv fwd KV / replay KV / grad", "send / recv B",
                                   "resident QKV / remote block / online state"};
  if (res.layer) head.push_back("all-reduce send / recv");
  TextTable t(head);
  Index sent = 0;
  for (const io::RankRow& r : res.report.ranks) {
    const core::Ledger& g = r.ledger;
    sent += 8 * g.send_elems();
    t.row({std::to_string(r.rank), positions_of(res.layout, r.rank),
           fmt::format("{} / {} / {}", g.fwd_kv_send_elems, g.replay_kv_send_elems, g.grad_send_elems),
           fmt::format("{} / {} / {}", g.fwd_kv_recv_elems, g.replay_kv_recv_elems, g.grad_recv_elems),
           fmt::format("{} / {}", 8 * g.send_elems(), 8 * g.recv_elems()),
           fmt::format("{} / {} / {}", g.resident_qkv_elems, g.remote_block_elems, g.online_state_elems)});
    if (res.layer)
      t.append(fmt::format("{} / {} elems", res.allreduce_elems[r.rank].first, res.allreduce_elems[r.rank].second));
  }
  t.print();
  if (res.layer)
    fmt::print("  all-reduce: dWo and [dWq | dWk | dWv] as reduce-scatter (each segment summed in rank order) then\n"
               "  all-gather; its elements are not in send / recv B, which count the ring.\n");
  fmt::print("  resident Q/K/V, the temporary remote K/V block and m/l/a are counted apart; O, LSE, gradients,\n"
             "  the compute workspace and communication buffers come on top.\n");
  if (res.traffic == core::Traffic::skip_empty_grads)
    fmt::print("  --skip-empty: {} B sent in all instead of {} B under the full protocol: {} B saved by not "
               "returning all-zero dK/dV contributions\n",
               sent, res.full_send_bytes, res.full_send_bytes - sent);
}

}  // namespace

void print_lab(const runtime::LabResult& res) {
  print_summary(res);
  print_inputs(res);
  print_events(res);
  print_final(res);
  if (res.layer) print_layer(res);
  print_ledger(res);
}

}  // namespace ringattn::app
