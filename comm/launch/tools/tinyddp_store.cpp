// tinyddp-store: a long-lived store server, for clusters where no rank should host it (and for
// tests that talk to a store from outside a job).
//
//   export TINYDDP_TOKEN=$(openssl rand -hex 16)           # the same on every host of the job
//   tinyddp-store --host 0.0.0.0 --port 29500            # then start ranks with TINYDDP_LAUNCHER_STORE=1
//
// It prints one line, "tinyddp-store listening on HOST:PORT", once it accepts connections (with
// --port 0 that is how you learn the port), and runs until SIGINT or SIGTERM.
//
// It listens on 127.0.0.1 unless --host says otherwise. On any other address it requires a token
// (--token or TINYDDP_TOKEN): without one, anyone who can reach the port could read and rewrite
// every job's keys. --insecure-no-token starts it anyway, with a warning on every start. However
// many clients connect, those that have not completed their hello are capped (--max-pending-hellos;
// the oldest is closed for a new one), and repeated log lines are rate-limited.
//
//   tinyddp-store --port 0 --log-ops                     # and print every request a client makes
//
// --log-ops shows what a job keeps in its store, step by step (docs/how-ddp-works.md pastes one).
// The server itself knows nothing of it: the tool puts a small relay in front of it. Clients
// connect to the relay, which passes every byte on to the real server on a loopback port and
// back, and decodes the requests it passes (comm/store/store_protocol.h) into one line each on stdout:
//
//   [store] client 2: compare_set tinyddp/default/0/rdzv/rank/1 expected="" desired="host pid 4242 #1f"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "tinyddp/comm/store/store_server.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/command_line.h"
#include "tinyddp/core/error.h"

namespace {

using namespace tinyddp::comm;

// SIGINT and SIGTERM stop the store. Any thread may be the one the kernel picks to receive them,
// including threads that libraries started before main() (OpenBLAS starts its pool when it is
// loaded), so a blocked mask plus sigwait() is not enough: a handler on every thread writes the
// signal's number into a pipe, and main() reads it there.
int g_stop_pipe[2] = {-1, -1};

void on_stop_signal(int signal) {
  const unsigned char number = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t written = ::write(g_stop_pipe[1], &number, 1);
}

void install_stop_handlers() {
  if (::pipe(g_stop_pipe) != 0) throw std::runtime_error("tinyddp-store: cannot create the stop pipe");
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// Blocks until SIGINT or SIGTERM arrived; returns its number. It waits in poll(), which a signal
// always interrupts, where SA_RESTART would restart a read(): a runtime that runs handlers late, at
// the thread's next call into it (ThreadSanitizer does), then still runs this one.
int wait_for_stop_signal() {
  pollfd stop{g_stop_pipe[0], POLLIN, 0};
  unsigned char number = 0;
  for (;;)
    if (::poll(&stop, 1, -1) == 1 && ::read(g_stop_pipe[0], &number, 1) == 1) return number;
}

// Reads exactly n bytes; false at EOF or on an error.
bool read_exactly(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t got = ::recv(fd, p, n, 0);
    if (got <= 0) return false;
    p += got;
    n -= size_t(got);
  }
  return true;
}

bool write_all(int fd, const void* data, size_t n) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put <= 0) return false;
    p += put;
    n -= size_t(put);
  }
  return true;
}

uint32_t little_endian_u32(const char* p) {
  return uint32_t(uint8_t(p[0])) | uint32_t(uint8_t(p[1])) << 8 | uint32_t(uint8_t(p[2])) << 16 |
         uint32_t(uint8_t(p[3])) << 24;
}

// A value as a person reads it: quoted text when it is printable, else its size.
std::string show_value(const std::string& value) {
  if (value.size() > 80) return "<" + std::to_string(value.size()) + " bytes>";
  for (char c : value)
    if (c < 0x20 || c > 0x7e) return "<" + std::to_string(value.size()) + " bytes>";
  return "\"" + value + "\"";
}

std::string describe_request(const protocol::Request& q) {
  std::string line = protocol::command_name(q.command);
  auto list = [](const std::vector<std::string>& keys) {
    std::string text;
    for (const auto& k : keys) text += (text.empty() ? "" : " ") + k;
    return text;
  };
  switch (q.command) {
    case protocol::Command::set:
    case protocol::Command::append: return line + " " + q.keys.at(0) + " = " + show_value(q.values.at(0));
    case protocol::Command::add: return line + " " + q.keys.at(0) + " += " + std::to_string(q.delta);
    case protocol::Command::compare_set:
      return line + " " + q.keys.at(0) + " expected=" + show_value(q.values.at(0)) +
             " desired=" + show_value(q.values.at(1));
    case protocol::Command::multi_set: {
      for (size_t i = 0; i < q.keys.size(); ++i) line += " " + q.keys[i] + " = " + show_value(q.values.at(i));
      return line;
    }
    case protocol::Command::num_keys: return line;
    default: return line + " " + list(q.keys);  // get, check, wait, multi_get, delete_key
  }
}

std::mutex output_mutex;

void log_op(int client, const std::string& text) {
  std::lock_guard lock(output_mutex);
  std::cout << "[store] client " << client << ": " << text << std::endl;
}

// One client's connection through the relay: bytes from the server go back unchanged on a second
// thread; bytes from the client are read hello first, then frame by frame, logged and passed on.
void relay(int client_fd, int client, int server_port, protocol::Limits limits) {
  int server_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(server_port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (server_fd < 0 || ::connect(server_fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    log_op(client, "the relay could not reach the server; closing");
    ::close(client_fd);
    if (server_fd >= 0) ::close(server_fd);
    return;
  }
  int one = 1;
  ::setsockopt(server_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(client_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::thread back([client_fd, server_fd] {
    char buffer[64 << 10];
    for (ssize_t got; (got = ::recv(server_fd, buffer, sizeof buffer, 0)) > 0;)
      if (!write_all(client_fd, buffer, size_t(got))) break;
    ::shutdown(client_fd, SHUT_WR);
  });
  std::string head(protocol::kHelloHeadBytes, '\0');
  bool ok = read_exactly(client_fd, head.data(), head.size());
  if (ok) {
    // The token is passed on, never printed.
    std::string token(std::min<uint32_t>(little_endian_u32(head.data() + 8), protocol::kMaxTokenBytes), '\0');
    ok = read_exactly(client_fd, token.data(), token.size()) && write_all(server_fd, head.data(), head.size()) &&
         write_all(server_fd, token.data(), token.size());
    if (ok) log_op(client, "connected");
  }
  while (ok) {
    char prefix[protocol::kFrameLengthBytes];
    if (!read_exactly(client_fd, prefix, sizeof prefix)) break;
    uint32_t length = little_endian_u32(prefix);
    if (length > limits.max_frame_bytes()) break;  // the server would close it too
    std::string body(length, '\0');
    if (!read_exactly(client_fd, body.data(), body.size())) break;
    try {
      log_op(client, describe_request(protocol::decode_request(body, limits)));
    } catch (const tinyddp::Error& e) {
      log_op(client, std::string("undecodable request (the server will say why): ") + e.what());
    }
    ok = write_all(server_fd, prefix, sizeof prefix) && write_all(server_fd, body.data(), body.size());
  }
  log_op(client, "disconnected");
  ::shutdown(server_fd, SHUT_WR);
  back.join();
  ::close(server_fd);
  ::close(client_fd);
}

// Listens on host:port (IPv4) and relays every connection to the server on loopback `server_port`.
// Returns the listening socket; `port` receives the port actually bound.
// Whether `host` names this machine's loopback (127.0.0.0/8, ::1, localhost): only then is a store
// without a token out of other machines' reach.
bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

int listen_for_relay(const std::string& host, int& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TINYDDP_CHECK(fd >= 0, "tinyddp-store --log-ops: socket() failed", tinyddp::hint("check the open-file limit"));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  TINYDDP_CHECK(::inet_pton(AF_INET, host.c_str(), &address.sin_addr) == 1, "tinyddp-store --log-ops: '", host,
                "' is not an IPv4 address",
                tinyddp::hint("--log-ops listens on IPv4 addresses only (e.g. --host 127.0.0.1)"));
  TINYDDP_CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 && ::listen(fd, 1024) == 0,
                "tinyddp-store --log-ops: cannot listen on ", host, ":", port,
                tinyddp::hint("another process holds the port (use --port 0 for a free one)"));
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  port = ntohs(address.sin_port);
  return fd;
}

// What the command line asks for.
struct StoreCommand {
  tinyddp::comm::StoreServerOptions options;
  bool insecure_no_token = false;
  bool log_ops = false;
};

// Fills `command` from argv; an exit code when the program ends here (--help, a bad flag).
std::optional<int> parse_command(int argc, char** argv, StoreCommand& command) {
  using tinyddp::comm::TcpStore;
  CLI::App app{"tinyddp-store: a standalone tinyddp key-value store server"};
  tinyddp::comm::StoreServerOptions& options = command.options;
  uint64_t idle_limit_ms = 30000;
  std::string token = TcpStore::token_from_environment();
  app.add_option("--host", options.host, "address to listen on (0.0.0.0: every IPv4 address; needs a token)")
      ->capture_default_str();
  app.add_option("--port", options.port, "port to listen on (0: any free port, printed at start)")
      ->capture_default_str();
  app.add_option("--token", token, "token clients must present (default: $TINYDDP_TOKEN; empty: none)");
  app.add_option("--max-value-bytes", options.limits.max_value_bytes, "largest value accepted")->capture_default_str();
  app.add_option("--idle-limit-ms", idle_limit_ms, "how long a client may take to finish a hello or a frame")
      ->capture_default_str();
  app.add_option("--max-pending-hellos", options.max_pending_hellos,
                 "connections allowed open without a completed hello (the oldest is closed for a new one)")
      ->capture_default_str();
  app.add_flag("--insecure-no-token", command.insecure_no_token,
               "listen on a non-loopback address without a token (anyone who reaches the port can change the keys)");
  app.add_flag("--log-ops", command.log_ops, "print every request clients make (one line each, on stdout)");
  if (auto code = tinyddp::command_line::parse(app, argc, argv)) return code;
  options.token = token;
  options.idle_limit = std::chrono::milliseconds(idle_limit_ms);
  return std::nullopt;
}

// A store reachable from other hosts without a token lets anyone change every job's keys: refused (exit
// 2) unless the user accepted that with --insecure-no-token, and then said aloud.
std::optional<int> refuse_unprotected(const StoreCommand& command) {
  const tinyddp::comm::StoreServerOptions& options = command.options;
  if (!options.token.empty() || is_loopback_host(options.host)) return std::nullopt;
  if (!command.insecure_no_token) {
    std::cerr << "tinyddp-store: refusing to listen on " << options.host
              << " without a token: anyone who can reach the port could read and change every key of every job; "
                 "hint: export TINYDDP_TOKEN=<a secret> here and on every rank (or pass --token), or listen on "
                 "127.0.0.1, or accept the risk with --insecure-no-token"
              << std::endl;
    return 2;
  }
  std::cerr << "tinyddp-store: WARNING: --insecure-no-token: listening on " << options.host
            << " with no token; any process that can reach this port can read and change the jobs' keys" << std::endl;
  return std::nullopt;
}

// Room for many clients: the soft open-file limit (often 1024) up to the hard one.
void raise_open_file_limit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
}

// Serves until SIGINT or SIGTERM.
int serve(const tinyddp::comm::StoreServerOptions& options) {
  tinyddp::comm::StoreServer server(options);
  std::cout << "tinyddp-store listening on " << server.host() << ":" << server.port() << std::endl;
  const int signal = wait_for_stop_signal();
  std::cerr << "tinyddp-store: stopping on signal " << signal << std::endl;
  server.stop();
  return 0;
}

// --log-ops: the real server on a private loopback port, and a relay on the address the user asked for
// that prints each request as it passes.
int serve_logging_requests(tinyddp::comm::StoreServerOptions options) {
  const std::string public_host = options.host;
  int public_port = options.port;
  options.host = "127.0.0.1";
  options.port = 0;
  tinyddp::comm::StoreServer server(options);
  int listener = listen_for_relay(public_host, public_port);
  std::thread acceptor([listener, &server, limits = options.limits] {
    for (int client = 1;; ++client) {
      int fd = ::accept(listener, nullptr, nullptr);
      if (fd < 0) return;  // the listener was shut down
      std::thread(relay, fd, client, server.port(), limits).detach();
    }
  });
  std::cout << "tinyddp-store listening on " << public_host << ":" << public_port << " (logging every request)"
            << std::endl;
  const int signal = wait_for_stop_signal();
  std::cerr << "tinyddp-store: stopping on signal " << signal << std::endl;
  ::shutdown(listener, SHUT_RDWR);
  acceptor.join();
  ::close(listener);
  server.stop();
  // Relays still attached to a client end with the process (they only forward bytes).
  std::cout.flush();
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  StoreCommand command;
  if (auto code = parse_command(argc, argv, command)) return *code;
  if (auto code = refuse_unprotected(command)) return *code;
  raise_open_file_limit();
  install_stop_handlers();
  try {
    return command.log_ops ? serve_logging_requests(command.options) : serve(command.options);
  } catch (const tinyddp::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
