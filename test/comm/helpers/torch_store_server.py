# PyTorch's own TCPStore server, for the tests of our client of it (test/comm/store/test_torch_tcp_store.cpp).
#
#   python3 torch_store_server.py [libuv|classic]
#
# Hosts a TCPStore on a free loopback port and prints "port N". Then it plays its part of the test:
# it sets "from-python", waits for the C++ client's "from-cpp" and "counter", and answers with
# "verdict" = "<from-cpp>|<counter>", read back by the client. It exits on "bye" (or after 60 s).
# Python's TCPStore puts "/" before every key, so the C++ side writes "/from-cpp" for "from-cpp".
import datetime
import sys

import torch
import torch.distributed as dist

kwargs = {}
if len(sys.argv) > 1 and sys.argv[1] in ("libuv", "classic"):
    kwargs["use_libuv"] = sys.argv[1] == "libuv"
store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False, **kwargs)
store.set("from-python", "hello from torch " + torch.__version__)
print("port", store.port, "torch", torch.__version__, flush=True)
store.wait(["from-cpp", "counter-done"])
store.set("verdict", store.get("from-cpp").decode() + "|" + store.get("counter").decode())
store.wait(["bye"])
