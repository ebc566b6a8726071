// --api-key matching: the Bearer scheme in any case, the key exactly, compared in constant time.
#include <gtest/gtest.h>

#include "server/api_key.h"

namespace specula::server {
namespace {

TEST(ApiKey, BearerSchemeIsCaseInsensitiveAndTheKeyExact) {
  EXPECT_TRUE(bearer_token_matches("Bearer k3y", "k3y"));
  EXPECT_TRUE(bearer_token_matches("bearer k3y", "k3y"));
  EXPECT_TRUE(bearer_token_matches("BeArEr \tk3y  ", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearer K3Y", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearer k3", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearer k3yy", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearerk3y", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Basic k3y", "k3y"));
  EXPECT_FALSE(bearer_token_matches("Bearer ", "k3y"));
  EXPECT_FALSE(bearer_token_matches("", "k3y"));
}

TEST(ApiKey, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(constant_time_equals("", ""));
  EXPECT_TRUE(constant_time_equals("abc", "abc"));
  EXPECT_FALSE(constant_time_equals("abd", "abc"));
  EXPECT_FALSE(constant_time_equals("ab", "abc"));
  EXPECT_FALSE(constant_time_equals("abcd", "abc"));
  EXPECT_FALSE(constant_time_equals(std::string("ab\0", 3), "ab"));
}

}  // namespace
}  // namespace specula::server
