// tinyddp-store: a long-lived store server, for clusters where no rank should host it (and for
// tests that talk to a store from outside a job).
//
//   tinyddp-store --host 0.0.0.0 --port 29500            # then start ranks with TINYDDP_LAUNCHER_STORE=1
//
// It prints one line, "tinyddp-store listening on HOST:PORT", once it accepts connections (with
// --port 0 that is how you learn the port), and runs until SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "comm/store_server.h"
#include "comm/tcp_store.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace tinyddp::comm;
  CLI::App app{"tinyddp-store: a standalone tinyddp key-value store server"};
  StoreServerOptions options;
  uint64_t idle_limit_ms = 30000;
  std::string token = TcpStore::token_from_environment();
  app.add_option("--host", options.host, "address to listen on (0.0.0.0: every IPv4 address)")->capture_default_str();
  app.add_option("--port", options.port, "port to listen on (0: any free port, printed at start)")->capture_default_str();
  app.add_option("--token", token, "token clients must present (default: $TINYDDP_TOKEN; empty: none)");
  app.add_option("--max-value-bytes", options.limits.max_value_bytes, "largest value accepted")->capture_default_str();
  app.add_option("--idle-limit-ms", idle_limit_ms, "how long a client may take to finish a hello or a frame")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  options.token = token;
  options.idle_limit = std::chrono::milliseconds(idle_limit_ms);

  // Block the stop signals before the server's thread starts (it inherits the mask), then wait for
  // them here: the event loop is never interrupted by a handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  try {
    StoreServer server(options);
    std::cout << "tinyddp-store listening on " << server.host() << ":" << server.port() << std::endl;
    int signal = 0;
    sigwait(&stop_signals, &signal);
    std::cerr << "tinyddp-store: stopping on signal " << signal << std::endl;
    server.stop();
  } catch (const tinyddp::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}
