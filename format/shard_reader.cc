#include "format/shard_reader.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "common/hash.h"
#include "format/tar_zstd.h"

namespace kiln {

using format::detail::kIoBufferBytes;
using format::detail::kTarBlock;
using format::detail::member_error;
using format::detail::quote_name;
using format::detail::shard_error;
using format::detail::tar_source_read;
using format::detail::TarSource;

namespace {

const char* filetype_name(mode_t type) {
  switch (type) {
    case AE_IFLNK: return "a symbolic link";
    case AE_IFDIR: return "a directory";
    case AE_IFCHR: return "a character device";
    case AE_IFBLK: return "a block device";
    case AE_IFIFO: return "a FIFO";
    case AE_IFSOCK: return "a socket";
    default: return "not a regular file";
  }
}

class ShardReaderImpl final : public ShardReader {
 public:
  ShardReaderImpl(std::string path, ShardReaderOptions options)
      : path_(std::move(path)), options_(options) {}

  ~ShardReaderImpl() override {
    if (archive_) archive_read_free(archive_);
    if (fd_ >= 0) ::close(fd_);
  }

  Status open() {
    KILN_ASSIGN_OR_RETURN(ShardCompression compression, shard_compression_for_path(path_));
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return Status::from_errno("open shard", path_);
    struct stat st;
    if (::fstat(fd_, &st) != 0) return Status::from_errno("stat shard", path_);
    if (!S_ISREG(st.st_mode)) return shard_error(path_, "not a regular file");
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    if (options_.expected_xxh3) KILN_RETURN_IF_ERROR(verify_checksum(*options_.expected_xxh3));
    KILN_RETURN_IF_ERROR(source_.open(fd_, compression == ShardCompression::kZstd, path_));
    if (options_.max_tar_bytes) {
      source_.set_limit(*options_.max_tar_bytes, "the manifest's tar_bytes for this shard");
    }
    archive_ = archive_read_new();
    if (!archive_) return Status::internal("libarchive: out of memory");
    if (archive_read_support_format_tar(archive_) != ARCHIVE_OK) {
      return Status::internal(std::string("libarchive: ") + archive_error_string(archive_));
    }
    if (archive_read_open(archive_, &source_, nullptr, tar_source_read, nullptr) != ARCHIVE_OK) {
      return fail(shard_error(path_, "not a readable tar archive (failed before the first member): " +
                                         archive_message()));
    }
    return Status::ok();
  }

  Result<bool> next(ShardSample* out) override {
    if (!failed_.is_ok()) return failed_;
    if (done_) return false;
    if (!have_pending_) {
      Result<bool> got = read_member();
      if (!got.is_ok()) return fail(std::move(got).take_status());
      if (!*got) {
        done_ = true;
        return false;
      }
    }
    // Start the sample with the pending member; swap strings so buffers circulate, not copies.
    out->key.swap(pending_key_);
    current_key_.assign(out->key);
    if (!seen_keys_.insert(out->key).second) {
      return fail(member_error(path_, member_name_,
                               "key " + quote_name(out->key) +
                                   " appears again after other keys (a sample's members must be "
                                   "consecutive, and keys unique in a shard)"));
    }
    size_t used = 0;
    uint64_t sample_bytes = pending_.data.size();
    if (sample_bytes > options_.max_sample_bytes) {
      return fail(member_error(path_, member_name_,
                               "sample " + quote_name(out->key) + " holds more than " +
                                   std::to_string(options_.max_sample_bytes) +
                                   " bytes (max_sample_bytes)"));
    }
    take_pending(out, &used);
    for (;;) {
      Result<bool> got = read_member();
      if (!got.is_ok()) return fail(std::move(got).take_status());
      if (!*got) {
        done_ = true;
        break;
      }
      if (pending_key_ != out->key) break;  // starts the next sample
      for (size_t i = 0; i < used; ++i) {
        if (out->members[i].ext == pending_.ext) {
          return fail(member_error(path_, member_name_,
                                   "duplicate ext " + quote_name(pending_.ext) + " for key " +
                                       quote_name(out->key)));
        }
      }
      if (used + 1 > options_.max_sample_members) {
        return fail(member_error(path_, member_name_,
                                 "sample " + quote_name(out->key) + " has more than " +
                                     std::to_string(options_.max_sample_members) +
                                     " members (max_sample_members)"));
      }
      sample_bytes += pending_.data.size();
      if (sample_bytes > options_.max_sample_bytes) {
        return fail(member_error(path_, member_name_,
                                 "sample " + quote_name(out->key) + " holds more than " +
                                     std::to_string(options_.max_sample_bytes) +
                                     " bytes (max_sample_bytes)"));
      }
      take_pending(out, &used);
    }
    out->members.resize(used);
    return true;
  }

  uint64_t tar_bytes() const override {
    la_int64_t n = archive_ ? archive_filter_bytes(archive_, 0) : 0;
    return n > 0 ? static_cast<uint64_t>(n) : 0;
  }

 private:
  void take_pending(ShardSample* out, size_t* used) {
    if (out->members.size() <= *used) out->members.resize(*used + 1);
    ShardMember& m = out->members[*used];
    m.ext.swap(pending_.ext);
    m.data.swap(pending_.data);
    m.skipped = pending_.skipped;
    ++*used;
    have_pending_ = false;
  }

  std::string archive_message() const {
    if (!source_.error().empty()) return source_.error();
    const char* msg = archive_error_string(archive_);
    return msg ? msg : "unknown libarchive error";
  }

  std::string where_after() const {
    return member_name_.empty() ? std::string("the first member")
                                : "the member after " + quote_name(member_name_);
  }

  // Reads the next member into pending_ / pending_key_. False at the (verified) end.
  Result<bool> read_member() {
    struct archive_entry* entry = nullptr;
    int r = archive_read_next_header(archive_, &entry);
    if (r == ARCHIVE_EOF) {
      KILN_RETURN_IF_ERROR(check_end());
      return false;
    }
    if (r != ARCHIVE_OK) {
      return shard_error(path_, "reading the header of " + where_after() + ": " +
                                    archive_message() + " (truncated or corrupt shard)");
    }
    const char* raw = archive_entry_pathname(entry);
    if (!raw || !*raw) {
      return shard_error(path_, "member after " + quote_name(member_name_) +
                                    " has an empty or undecodable name");
    }
    member_name_.assign(raw);
    std::string_view name = member_name_;
    if (name.front() == '/') return member_error(path_, name, "absolute path");
    for (size_t pos = 0; pos <= name.size();) {
      size_t slash = name.find('/', pos);
      if (slash == std::string_view::npos) slash = name.size();
      if (name.substr(pos, slash - pos) == "..") {
        return member_error(path_, name, "path with a '..' component");
      }
      pos = slash + 1;
    }
    const char* hardlink = archive_entry_hardlink(entry);
    if (hardlink) {
      return member_error(path_, name, std::string("a hard link to ") + quote_name(hardlink) +
                                           ", not a regular file");
    }
    mode_t type = archive_entry_filetype(entry);
    if (type != AE_IFREG) {
      std::string what = filetype_name(type);
      const char* target = archive_entry_symlink(entry);
      if (type == AE_IFLNK && target) what += std::string(" to ") + quote_name(target);
      return member_error(path_, name, what + ", not a regular file");
    }
    if (archive_entry_sparse_count(entry) > 0) {
      return member_error(path_, name, "a sparse file, not a plain regular file");
    }
    if (!archive_entry_size_is_set(entry) || archive_entry_size(entry) < 0) {
      return member_error(path_, name, "member has no size");
    }
    auto size = static_cast<uint64_t>(archive_entry_size(entry));
    if (size > options_.max_member_bytes) {
      return member_error(path_, name, std::to_string(size) + " bytes, over the limit of " +
                                           std::to_string(options_.max_member_bytes) +
                                           " (max_member_bytes)");
    }
    size_t dot = name.find('.');
    if (dot == std::string_view::npos) {
      return member_error(path_, name, "name has no extension (expected <key>.<ext>)");
    }
    pending_key_.assign(name.substr(0, dot));
    pending_.ext.assign(name.substr(dot + 1));
    Status st = validate_sample_key(pending_key_);
    if (st.is_ok()) st = validate_member_ext(pending_.ext);
    if (!st.is_ok()) {
      return member_error(path_, name, "not a valid <key>.<ext> name: " + st.message());
    }
    // Which sample this member belongs to: the current one, or (another key) the next.
    if (samples_started_ == 0 || pending_key_ != current_key_) ++samples_started_;
    pending_.data.clear();
    pending_.skipped = options_.want && !options_.want(samples_started_ - 1, pending_.ext);
    if (pending_.skipped) {
      // libarchive consumes the member and its padding from the stream without a copy.
      r = archive_read_data_skip(archive_);
      if (r != ARCHIVE_OK) {
        return member_error(path_, name,
                            "reading data: " + archive_message() + " (truncated or corrupt shard)");
      }
      end_of_members_ = tar_bytes();
      have_pending_ = true;
      return true;
    }
    // Data: archive_read_data_block hands out pointers into the decompressed buffer; one copy.
    pending_.data.reserve(size);
    for (;;) {
      const void* block = nullptr;
      size_t len = 0;
      la_int64_t offset = 0;
      r = archive_read_data_block(archive_, &block, &len, &offset);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK) {
        return member_error(path_, name, "reading data: " + archive_message() +
                                              " (truncated or corrupt shard)");
      }
      if (static_cast<uint64_t>(offset) != pending_.data.size() ||
          pending_.data.size() + len > size) {
        return member_error(path_, name, "data blocks are not contiguous");
      }
      pending_.data.append(static_cast<const char*>(block), len);
    }
    if (pending_.data.size() != size) {
      return member_error(path_, name, "holds " + std::to_string(pending_.data.size()) +
                                           " bytes, header says " + std::to_string(size) +
                                           " (truncated shard)");
    }
    // The member and its padding are consumed: where the next header (or the end) starts.
    end_of_members_ = tar_bytes();
    have_pending_ = true;
    return true;
  }

  // At libarchive's EOF: require two zero blocks right after the last member (libarchive also
  // accepts a stream that simply stops at a member boundary, which is what truncation looks like),
  // then only zero padding, then the end of a complete zstd stream.
  Status check_end() {
    std::string after =
        member_name_.empty() ? std::string("before any member") : "after member " + quote_name(member_name_);
    uint64_t end = tar_bytes();
    if (end < end_of_members_ + 2 * kTarBlock) {
      return shard_error(path_, "the archive ends " + after +
                                    " without the end-of-archive marker (truncated shard)");
    }
    bool checkable = false;
    if (!source_.delivered_tail_is_zero(end, &checkable)) {
      return shard_error(path_, checkable ? "data follows the end-of-archive marker " + after +
                                                " (concatenated or damaged archive)"
                                          : "cannot check the bytes after the end-of-archive marker");
    }
    std::string tail = source_.drain_zero_tail();
    if (!tail.empty()) return shard_error(path_, tail + " (" + after + ")");
    return Status::ok();
  }

  Status verify_checksum(uint64_t expected) {
    Xxh3Stream hash;
    std::vector<char> buf(kIoBufferBytes);
    uint64_t offset = 0;
    for (;;) {
      ssize_t r = ::pread(fd_, buf.data(), buf.size(), static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Status::from_errno("read shard", path_);
      }
      if (r == 0) break;
      hash.update(buf.data(), static_cast<size_t>(r));
      offset += static_cast<uint64_t>(r);
    }
    uint64_t actual = hash.digest();
    if (actual == expected) return Status::ok();
    // Name the member where the damage shows, when a plain read finds it.
    // Name the member where the damage shows, streaming one sample at a time (a damaged shard
    // is never held whole).
    std::string where;
    ShardReaderOptions plain = options_;
    plain.expected_xxh3.reset();
    Status diag_status;
    uint64_t diag_samples = 0;
    std::string last_member;
    if (auto diag = ShardReader::open(path_, plain); !diag.is_ok()) {
      diag_status = diag.status();
    } else {
      ShardSample sample;
      for (;;) {
        Result<bool> more = (*diag)->next(&sample);
        if (!more.is_ok()) {
          diag_status = more.status();
          break;
        }
        if (!*more) break;
        ++diag_samples;
        if (!sample.members.empty()) last_member = sample.key + "." + sample.members.back().ext;
      }
    }
    if (!diag_status.is_ok()) {
      std::string msg = diag_status.message();
      std::string prefix = "shard " + quote_name(path_) + ": ";
      if (msg.starts_with(prefix)) msg = msg.substr(prefix.size());
      where = "; reading it fails: " + msg;
    } else {
      where = "; every member still parses (" + std::to_string(diag_samples) +
              " samples), so the damage is inside member data";
      if (!last_member.empty()) where += " (last member " + quote_name(last_member) + ")";
    }
    return shard_error(path_, "checksum mismatch: expected xxh3 " + hex64(expected) +
                                  ", the file has " + hex64(actual) + " (" +
                                  std::to_string(offset) + " bytes)" + where);
  }

  Status fail(Status st) {
    if (!st.is_ok() && failed_.is_ok()) failed_ = st;
    return st;
  }

  std::string path_;
  ShardReaderOptions options_;
  int fd_ = -1;
  TarSource source_;
  struct archive* archive_ = nullptr;
  bool done_ = false;
  Status failed_;
  bool have_pending_ = false;
  std::string pending_key_;
  ShardMember pending_;
  std::string member_name_;
  std::string current_key_;       // key of the sample being assembled
  uint64_t samples_started_ = 0;  // samples whose first member has been read
  uint64_t end_of_members_ = 0;
  std::unordered_set<std::string> seen_keys_;
};

}  // namespace

Result<std::unique_ptr<ShardReader>> ShardReader::open(const std::string& path,
                                                       ShardReaderOptions options) {
  auto reader = std::make_unique<ShardReaderImpl>(path, options);
  KILN_RETURN_IF_ERROR(reader->open());
  return std::unique_ptr<ShardReader>(std::move(reader));
}

Result<std::vector<ShardSample>> ShardReader::read_all(const std::string& path,
                                                       ShardReaderOptions options) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader, ShardReader::open(path, options));
  std::vector<ShardSample> samples;
  for (;;) {
    ShardSample sample;
    KILN_ASSIGN_OR_RETURN(bool more, reader->next(&sample));
    if (!more) break;
    samples.push_back(std::move(sample));
  }
  return samples;
}

}  // namespace kiln
