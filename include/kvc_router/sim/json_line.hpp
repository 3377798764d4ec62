// kvc_router/sim/json_line.hpp
//
// A small, strict parser for one line of a JSONL trace: a single flat JSON
// object whose interesting values are numbers, strings and arrays of
// integers. It exists so the trace loaders (sim/trace.hpp) need no JSON
// library and so every malformed byte of an external file becomes an
// absl::Status naming the column, never a crash or a silent default.
//
// What it accepts: exactly one object, surrounded by optional whitespace; the
// full JSON grammar for values, so that fields the loaders do not know
// (nested objects, arrays of strings, booleans, null) are skipped rather than
// refused. Nesting is bounded (kMaxJsonDepth) so a hostile line cannot
// exhaust the stack. Duplicate keys are refused: a trace line that says two
// different things about one field is ambiguous.
//
//   absl::StatusOr<kvc_router::sim::JsonLine> line =
//       kvc_router::sim::JsonLine::Parse(R"({"input_length": 12, "hash_ids": [0, 1]})");
//   if (line.ok()) { const kvc_router::sim::JsonValue* v = line->Find("hash_ids"); }
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvc_router::sim {

// Deepest nesting of arrays/objects accepted inside the top-level object.
inline constexpr int kMaxJsonDepth = 32;

// One member value of the top-level object.
struct JsonValue {
  enum class Kind : uint8_t {
    kNull,
    kBool,
    kNumber,
    kString,
    // An array whose elements are all integer literals (possibly empty).
    kIntArray,
    // Anything else (a nested object, an array of other things): skipped.
    kOther,
  };

  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0.0;
  // True when the number was written as an integer literal that fits int64.
  bool is_integer = false;
  int64_t integer = 0;
  std::string string;
  std::vector<int64_t> integers;
};

class JsonLine {
 public:
  // Parses `text` (one line, without its newline; a trailing '\r' is
  // allowed). Errors name the 1-based column.
  static absl::StatusOr<JsonLine> Parse(std::string_view text) {
    JsonLine line;
    Parser parser(text, line);
    if (absl::Status status = parser.Run(); !status.ok()) return status;
    return line;
  }

  // The value of `key`, or nullptr when the line has no such member.
  const JsonValue* Find(std::string_view key) const {
    for (const auto& [name, value] : members_) {
      if (name == key) return &value;
    }
    return nullptr;
  }

  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }

 private:
  class Parser {
   public:
    Parser(std::string_view text, JsonLine& out) : text_(text), out_(out) {}

    absl::Status Run() {
      SkipSpace();
      if (!Consume('{')) return Error("expected '{' at the start of the object");
      SkipSpace();
      if (!Consume('}')) {
        while (true) {
          SkipSpace();
          std::string key;
          if (Peek() != '"') return Error("expected a string key");
          if (absl::Status s = ParseString(key); !s.ok()) return s;
          for (const auto& member : out_.members_) {
            if (member.first == key) {
              return Error(absl::StrCat("duplicate key \"", key, "\""));
            }
          }
          SkipSpace();
          if (!Consume(':')) return Error("expected ':' after a key");
          SkipSpace();
          JsonValue value;
          if (absl::Status s = ParseMemberValue(value); !s.ok()) return s;
          out_.members_.emplace_back(std::move(key), std::move(value));
          SkipSpace();
          if (Consume(',')) continue;
          if (Consume('}')) break;
          return Error("expected ',' or '}' after a value");
        }
      }
      SkipSpace();
      if (pos_ != text_.size()) return Error("unexpected characters after the object");
      return absl::OkStatus();
    }

   private:
    char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
    bool AtEnd() const { return pos_ >= text_.size(); }
    bool Consume(char c) {
      if (pos_ < text_.size() && text_[pos_] == c) {
        ++pos_;
        return true;
      }
      return false;
    }
    void SkipSpace() {
      while (pos_ < text_.size() &&
             (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
              text_[pos_] == '\r')) {
        ++pos_;
      }
    }
    absl::Status Error(std::string_view what) const {
      return absl::InvalidArgumentError(
          absl::StrCat("column ", pos_ + 1, ": ", std::string(what)));
    }

    absl::Status ParseMemberValue(JsonValue& value) {
      const char c = Peek();
      if (c == '"') {
        value.kind = JsonValue::Kind::kString;
        return ParseString(value.string);
      }
      if (c == '[') return ParseArray(value);
      if (c == '{') {
        value.kind = JsonValue::Kind::kOther;
        return SkipValue(1);
      }
      if (c == 't' || c == 'f' || c == 'n') {
        return ParseLiteral(value);
      }
      if (c == '-' || (c >= '0' && c <= '9')) {
        value.kind = JsonValue::Kind::kNumber;
        return ParseNumber(value.number, value.is_integer, value.integer);
      }
      if (AtEnd()) return Error("unexpected end of line, expected a value");
      return Error("expected a value");
    }

    absl::Status ParseLiteral(JsonValue& value) {
      const std::string_view rest = text_.substr(pos_);
      if (rest.substr(0, 4) == "true") {
        value.kind = JsonValue::Kind::kBool;
        value.boolean = true;
        pos_ += 4;
      } else if (rest.substr(0, 5) == "false") {
        value.kind = JsonValue::Kind::kBool;
        pos_ += 5;
      } else if (rest.substr(0, 4) == "null") {
        value.kind = JsonValue::Kind::kNull;
        pos_ += 4;
      } else {
        return Error("invalid literal (expected true, false or null)");
      }
      return absl::OkStatus();
    }

    // An array at the top level: kept when every element is an integer.
    absl::Status ParseArray(JsonValue& value) {
      const size_t start = pos_;
      ++pos_;  // '['
      value.kind = JsonValue::Kind::kIntArray;
      SkipSpace();
      if (Consume(']')) return absl::OkStatus();
      while (true) {
        SkipSpace();
        const char c = Peek();
        if (c == '-' || (c >= '0' && c <= '9')) {
          double number = 0;
          bool is_integer = false;
          int64_t integer = 0;
          if (absl::Status s = ParseNumber(number, is_integer, integer); !s.ok()) return s;
          if (!is_integer) {
            // Not an integer array after all: re-scan it as an opaque value.
            pos_ = start;
            value.integers.clear();
            value.kind = JsonValue::Kind::kOther;
            return SkipValue(1);
          }
          value.integers.push_back(integer);
        } else {
          pos_ = start;
          value.integers.clear();
          value.kind = JsonValue::Kind::kOther;
          return SkipValue(1);
        }
        SkipSpace();
        if (Consume(',')) continue;
        if (Consume(']')) return absl::OkStatus();
        if (AtEnd()) return Error("unexpected end of line inside an array");
        return Error("expected ',' or ']' in an array");
      }
    }

    // Validates and skips any JSON value; `depth` is the nesting of the value.
    absl::Status SkipValue(int depth) {
      if (depth > kMaxJsonDepth) return Error("nesting too deep");
      SkipSpace();
      const char c = Peek();
      if (c == '"') {
        std::string ignored;
        return ParseString(ignored);
      }
      if (c == 't' || c == 'f' || c == 'n') {
        JsonValue ignored;
        return ParseLiteral(ignored);
      }
      if (c == '-' || (c >= '0' && c <= '9')) {
        double number = 0;
        bool is_integer = false;
        int64_t integer = 0;
        return ParseNumber(number, is_integer, integer);
      }
      if (c == '[') {
        ++pos_;
        SkipSpace();
        if (Consume(']')) return absl::OkStatus();
        while (true) {
          if (absl::Status s = SkipValue(depth + 1); !s.ok()) return s;
          SkipSpace();
          if (Consume(',')) continue;
          if (Consume(']')) return absl::OkStatus();
          if (AtEnd()) return Error("unexpected end of line inside an array");
          return Error("expected ',' or ']' in an array");
        }
      }
      if (c == '{') {
        ++pos_;
        SkipSpace();
        if (Consume('}')) return absl::OkStatus();
        while (true) {
          SkipSpace();
          if (Peek() != '"') return Error("expected a string key");
          std::string ignored;
          if (absl::Status s = ParseString(ignored); !s.ok()) return s;
          SkipSpace();
          if (!Consume(':')) return Error("expected ':' after a key");
          if (absl::Status s = SkipValue(depth + 1); !s.ok()) return s;
          SkipSpace();
          if (Consume(',')) continue;
          if (Consume('}')) return absl::OkStatus();
          if (AtEnd()) return Error("unexpected end of line inside an object");
          return Error("expected ',' or '}' in an object");
        }
      }
      if (AtEnd()) return Error("unexpected end of line, expected a value");
      return Error("expected a value");
    }

    // JSON number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
    absl::Status ParseNumber(double& number, bool& is_integer, int64_t& integer) {
      const size_t start = pos_;
      Consume('-');
      if (Consume('0')) {
        // A leading zero stands alone.
      } else if (Peek() >= '1' && Peek() <= '9') {
        while (Peek() >= '0' && Peek() <= '9') ++pos_;
      } else {
        return Error("invalid number");
      }
      bool integral = true;
      if (Consume('.')) {
        integral = false;
        if (!(Peek() >= '0' && Peek() <= '9')) return Error("invalid number: digits expected after '.'");
        while (Peek() >= '0' && Peek() <= '9') ++pos_;
      }
      if (Peek() == 'e' || Peek() == 'E') {
        integral = false;
        ++pos_;
        if (Peek() == '+' || Peek() == '-') ++pos_;
        if (!(Peek() >= '0' && Peek() <= '9')) return Error("invalid number: digits expected in the exponent");
        while (Peek() >= '0' && Peek() <= '9') ++pos_;
      }
      const char* first = text_.data() + start;
      const char* last = text_.data() + pos_;
      is_integer = false;
      if (integral) {
        int64_t value = 0;
        auto [ptr, ec] = std::from_chars(first, last, value);
        if (ec == std::errc() && ptr == last) {
          is_integer = true;
          integer = value;
          number = static_cast<double>(value);
          return absl::OkStatus();
        }
      }
      double value = 0;
      auto [ptr, ec] = std::from_chars(first, last, value);
      if (ec != std::errc() || ptr != last || !std::isfinite(value)) {
        return Error("number out of range");
      }
      number = value;
      return absl::OkStatus();
    }

    static int HexDigit(char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    }

    absl::Status ParseHex4(uint32_t& out) {
      if (pos_ + 4 > text_.size()) return Error("truncated \\u escape");
      out = 0;
      for (int i = 0; i < 4; ++i) {
        const int digit = HexDigit(text_[pos_ + i]);
        if (digit < 0) return Error("invalid \\u escape");
        out = out * 16 + static_cast<uint32_t>(digit);
      }
      pos_ += 4;
      return absl::OkStatus();
    }

    static void AppendUtf8(uint32_t cp, std::string& out) {
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
      } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }

    absl::Status ParseString(std::string& out) {
      ++pos_;  // opening quote
      while (true) {
        if (AtEnd()) return Error("unterminated string");
        const char c = text_[pos_];
        if (c == '"') {
          ++pos_;
          return absl::OkStatus();
        }
        if (static_cast<unsigned char>(c) < 0x20) {
          return Error("control character inside a string");
        }
        if (c != '\\') {
          out.push_back(c);
          ++pos_;
          continue;
        }
        ++pos_;
        if (AtEnd()) return Error("unterminated escape");
        const char e = text_[pos_++];
        switch (e) {
          case '"': out.push_back('"'); break;
          case '\\': out.push_back('\\'); break;
          case '/': out.push_back('/'); break;
          case 'b': out.push_back('\b'); break;
          case 'f': out.push_back('\f'); break;
          case 'n': out.push_back('\n'); break;
          case 'r': out.push_back('\r'); break;
          case 't': out.push_back('\t'); break;
          case 'u': {
            uint32_t cp = 0;
            if (absl::Status s = ParseHex4(cp); !s.ok()) return s;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (!(Consume('\\') && Consume('u'))) return Error("unpaired surrogate in \\u escape");
              uint32_t low = 0;
              if (absl::Status s = ParseHex4(low); !s.ok()) return s;
              if (low < 0xDC00 || low > 0xDFFF) return Error("invalid low surrogate in \\u escape");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
              return Error("unpaired surrogate in \\u escape");
            }
            AppendUtf8(cp, out);
            break;
          }
          default:
            return Error("invalid escape in a string");
        }
      }
    }

    std::string_view text_;
    size_t pos_ = 0;
    JsonLine& out_;
  };

  std::vector<std::pair<std::string, JsonValue>> members_;
};

}  // namespace kvc_router::sim
