// replay_main.cpp — runs files through the libFuzzer target without libFuzzer (any compiler).
//
//   luce_fuzz_replay FILE|DIR...     every file (directories: every file in them, sorted)
//
// `make test` builds it with gcc's ASan/UBSan and replays the committed corpus and crash
// reproducers (tests/test_fuzz_regressions.py): each one loads, is refused cleanly, or generates,
// under the sanitizers. Prints "replayed N inputs" on success.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv);
extern "C" int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static void collect(const std::string &path, std::vector<std::string> &out) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) { std::fprintf(stderr, "no such file: %s\n", path.c_str()); std::exit(2); }
    if (!S_ISDIR(st.st_mode)) { out.push_back(path); return; }
    std::vector<std::string> names;
    if (DIR *d = opendir(path.c_str())) {
        while (dirent *e = readdir(d))
            if (e->d_name[0] != '.') names.push_back(path + "/" + e->d_name);
        closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const std::string &n : names) collect(n, out);
}

int main(int argc, char **argv) {
    LLVMFuzzerInitialize(&argc, &argv);
    std::vector<std::string> files;
    for (int i = 1; i < argc; ++i) collect(argv[i], files);
    for (const std::string &f : files) {
        std::ifstream in(f, std::ios::binary);
        std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), bytes.size());
        LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    }
    std::printf("replayed %zu inputs\n", files.size());
    return 0;
}
