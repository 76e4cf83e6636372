// End-to-end runs of `slim keygen|sign|verify|audit` through the built binary: output,
// exit codes (0 ok, 2 bad input, 3 integrity) and the named file in each error.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "test_runner.h"
#include "trust/test_util.h"

using namespace slim::trust::testing;
namespace fs = std::filesystem;

namespace {

struct CliResult {
  int rc;
  std::string out;
};

class TrustCli : public ::testing::Test {
 protected:
  void SetUp() override {
    slim_ = binary_dir() / "tools" / "slim";
    if (!fs::exists(slim_)) GTEST_SKIP() << "slim binary not built: " << slim_;
    dir_ = scratch_dir("cli");
  }
  CliResult run(const std::string& args) {
    const std::string cmd = slim::test::slim_runner_prefix() + shell_quote(slim_.string()) + " " + args + " 2>&1";
    CliResult r{-1, ""};
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    int status = pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  }
  std::string q(const fs::path& p) { return shell_quote(p.string()); }
  fs::path slim_, dir_;
};

}  // namespace

TEST_F(TrustCli, KeygenSignVerifyEveryKeyType) {
  for (const std::string alg : {"ecdsa-p256", "ed25519", "sm2"}) {
    fs::path model = dir_ / ("model_" + alg);
    write_file(model / "weights.bin", random_bytes(200000, 4));
    write_file(model / "sub" / "config.json", "{}");
    fs::path key = dir_ / (alg + ".pem");
    CliResult r = run("keygen --alg " + alg + " -o " + q(key));
    ASSERT_EQ(r.rc, 0) << r.out;
    r = run("sign " + q(model) + " --key " + q(key) + (alg == "sm2" ? " --hash sm3" : ""));
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("signed model_" + alg + ": 2 files"), std::string::npos) << r.out;
    r = run("verify " + q(model) + " --pub " + q(key.string() + ".pub"));
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("verified model_" + alg), std::string::npos) << r.out;

    write_file(model / "sub" / "config.json", "{ }");
    r = run("verify " + q(model) + " --pub " + q(key.string() + ".pub"));
    EXPECT_EQ(r.rc, 3) << r.out;
    EXPECT_NE(r.out.find("file 'sub/config.json' changed"), std::string::npos) << r.out;
  }
}

TEST_F(TrustCli, BadInputExitsWithTwo) {
  fs::path model = dir_ / "m";
  write_file(model / "a.bin", "abc");
  ASSERT_EQ(run("keygen -o " + q(dir_ / "k.pem")).rc, 0);
  write_file(dir_ / "garbage.sig", "\x01\x02not json");
  CliResult r = run("verify " + q(model) + " --pub " + q(dir_ / "k.pem.pub") + " --sig " + q(dir_ / "garbage.sig"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("garbage.sig: invalid JSON"), std::string::npos) << r.out;
  r = run("sign " + q(model) + " --key " + q(dir_ / "k.pem.pub"));  // a public key where a private one belongs
  EXPECT_EQ(r.rc, 2) << r.out;
  r = run("keygen -o " + q(dir_ / "k.pem"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("already exists"), std::string::npos) << r.out;
  EXPECT_EQ(run("keygen --alg rsa -o " + q(dir_ / "r.pem")).rc, 2);
  EXPECT_EQ(run("sign --help").rc, 0);
  EXPECT_EQ(run("audit verify --help").rc, 0);
}

TEST_F(TrustCli, AuditAppendCheckpointVerifyShow) {
  fs::path log = dir_ / "audit.jsonl";
  ASSERT_EQ(run("keygen --alg sm2 -o " + q(dir_ / "k.pem")).rc, 0);
  ASSERT_EQ(run("audit append " + q(log) + " --hash sm3 --event model.load --model gpt2 --version 3 --actor ops").rc, 0);
  ASSERT_EQ(run("audit append " + q(log) + " --event config.change --details '{\"threads\": 4}'").rc, 0);
  ASSERT_EQ(run("audit checkpoint " + q(log) + " --key " + q(dir_ / "k.pem")).rc, 0);
  CliResult r = run("audit verify " + q(log) + " --pub " + q(dir_ / "k.pem.pub"));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("records:     3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 signatures verified"), std::string::npos) << r.out;
  r = run("audit show " + q(log) + " --model gpt2");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("model.load  gpt2@3  by ops"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("config.change"), std::string::npos) << r.out;
  EXPECT_EQ(run("audit append " + q(log) + " --event x --details '[1]'").rc, 2);

  std::string text = read_file(log);
  text[text.find("ops")] = 'O';
  write_file(log, text);
  r = run("audit verify " + q(log));
  EXPECT_EQ(r.rc, 3) << r.out;
  EXPECT_NE(r.out.find("line 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("edited"), std::string::npos) << r.out;
}
