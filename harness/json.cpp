#include "harness/json.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace rmsnorm::harness {

std::string json_quote(const std::string& s) {
  std::string o = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += ch;
        }
    }
  }
  return o + "\"";
}

void JsonWriter::separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (levels_.empty()) return;
  Level& l = levels_.back();
  if (!l.empty) out_ += ',';
  l.empty = false;
  if (l.one_line) {
    if (out_.back() != '{' && out_.back() != '[') out_ += ' ';
  } else {
    out_ += '\n';
    out_.append(2 * levels_.size(), ' ');
  }
}

JsonWriter& JsonWriter::open(char bracket, bool one_line) {
  separate();
  out_ += bracket;
  levels_.push_back(Level{one_line || (!levels_.empty() && levels_.back().one_line)});
  return *this;
}

JsonWriter& JsonWriter::close(char bracket) {
  const Level l = levels_.back();
  levels_.pop_back();
  if (!l.one_line && !l.empty) {
    out_ += '\n';
    out_.append(2 * levels_.size(), ' ');
  }
  out_ += bracket;
  return *this;
}

JsonWriter& JsonWriter::key(const std::string& k) {
  separate();
  out_ += json_quote(k) + ": ";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::raw(const std::string& text) {
  separate();
  out_ += text;
  return *this;
}

JsonWriter& JsonWriter::value(const std::string& s) { return raw(json_quote(s)); }

JsonWriter& JsonWriter::value(double v) {
  if (!std::isfinite(v)) return null();
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 0x1p53)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.10g", v);
  return raw(buf);
}

JsonWriter& JsonWriter::value(float v) {
  if (!std::isfinite(v)) return null();
  char buf[40];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return raw(buf);
}

std::string json_file_error(const std::string& path) {
  std::FILE* existing = std::fopen(path.c_str(), "r");
  const bool existed = existing != nullptr;
  if (existing != nullptr) std::fclose(existing);
  std::FILE* f = std::fopen(path.c_str(), "a");  // "a": an existing file keeps its contents
  if (f == nullptr) return "cannot open '" + path + "' for writing: " + std::strerror(errno);
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
  return "";
}

std::string write_text_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return "cannot open '" + path + "' for writing: " + std::strerror(errno);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return "writing '" + path + "' failed";
  return "";
}

}  // namespace rmsnorm::harness
