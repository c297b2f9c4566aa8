// A small JSON writer for the result files of the CLI and the benchmark.
// Containers are written one member per line, indented, unless opened with
// one_line (then, and everything inside them, on one line), which keeps
// tables of records readable: one record per line.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace rmsnorm::harness {

class JsonWriter {
 public:
  JsonWriter& begin_object(bool one_line = false) { return open('{', one_line); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array(bool one_line = false) { return open('[', one_line); }
  JsonWriter& end_array() { return close(']'); }
  // The next value is this member of the enclosing object.
  JsonWriter& key(const std::string& k);

  JsonWriter& value(const std::string& s);
  JsonWriter& value(const char* s) { return value(std::string(s)); }
  JsonWriter& value(bool b) { return raw(b ? "true" : "false"); }
  // Non-finite numbers become null. Doubles: integers exactly (byte counts),
  // others to 10 significant digits (measurements); floats: the fewest digits
  // that read back as the same float (1e-05, not 9.99999975e-06).
  JsonWriter& value(double v);
  JsonWriter& value(float v);
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>>
  JsonWriter& value(T v) {
    return raw(std::to_string(v));
  }
  JsonWriter& null() { return raw("null"); }

  template <typename T>
  JsonWriter& field(const std::string& k, const T& v) {
    return key(k).value(v);
  }
  JsonWriter& null_field(const std::string& k) { return key(k).null(); }

  // The document so far, with a final newline once every container is closed.
  std::string str() const { return levels_.empty() ? out_ + "\n" : out_; }

 private:
  struct Level {
    bool one_line;
    bool empty = true;
  };
  JsonWriter& open(char bracket, bool one_line);
  JsonWriter& close(char bracket);
  JsonWriter& raw(const std::string& text);
  void separate();  // before a member: comma, then a newline and indent or a space
  std::string out_;
  std::vector<Level> levels_;
  bool after_key_ = false;
};

// JSON string literal of s, quotes included.
std::string json_quote(const std::string& s);

// Checks that `path` can be opened for writing, without changing an existing
// file (and without leaving a new empty one behind); returns "" or why not.
std::string json_file_error(const std::string& path);

// Writes text to path; returns "" or why it failed.
std::string write_text_file(const std::string& path, const std::string& text);

}  // namespace rmsnorm::harness
