// alloc_cxx MODE SECONDS: the C++ twin of alloc.c. Per request, MODE "alloc" makes a
// std::vector with operator new (an allocator that replaces operator new, as jemalloc,
// tcmalloc and mimalloc do, is entered there and never through malloc); MODE "prealloc"
// reuses one vector made at start-up. About 1000-2000 requests/s; ends by itself after
// SECONDS (at most 60).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

static std::unique_ptr<std::vector<int>> kept;
static std::vector<int> pool(64);

__attribute__((noinline)) static int handle_request_alloc(int i) {
    kept.reset(new std::vector<int>(64 + (i & 15), i));
    return (*kept)[3];
}

__attribute__((noinline)) static int handle_request_prealloc(int i) {
    for (auto &x : pool) x = i;
    return pool[3];
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    bool alloc = std::strcmp(argv[1], "alloc") == 0;
    double secs = std::atof(argv[2]);
    if (secs <= 0 || secs > 60) secs = 60;
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(secs);
    volatile int sink = 0;
    std::printf("ready\n");
    std::fflush(stdout);
    for (int i = 0; std::chrono::steady_clock::now() < end; i++) {
        sink += alloc ? handle_request_alloc(i) : handle_request_prealloc(i);
        std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    return 0;
}
