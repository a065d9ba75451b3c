// The built-in default domain rules: a byte-for-byte copy of configs/prep/domains.yaml
// (tests/domain_rules_test.cc checks they are equal; regenerate this file after editing it).
namespace kiln::prep {

extern const char* const kDefaultDomainRulesYaml;
const char* const kDefaultDomainRulesYaml = R"yaml(# Kiln's default domain rules: `kiln prep` uses them when domains.rules is "" (built-in copy).
# Rules apply in order; the first rule that matches a document names its domain; a document that
# no rule (and no fastText model above its threshold) assigns gets domains.default ("web").
# The full syntax is in docs/TAGGING.md. To change the rules, copy this file, edit it and run
#   kiln prep ... --set domains.rules=my-domains.yaml
# Domains here: code, zh (Chinese), legal (licences and legal notices), and the default web.
rules:
  # A domain the input declares (the "domain" field of a JSONL line) wins.
  - name: declared
    domain_from: domain
    input_domain: "*"

  # Source code by file name (text-folder documents: the file; JSONL: the input file) or URL path.
  - name: code-files
    domain: code
    any:
      - path: ["*.c", "*.h", "*.cc", "*.cpp", "*.cxx", "*.hpp", "*.hh", "*.hxx", "*.inl", "*.tcc",
               "*.cu", "*.cuh", "*.py", "*.pyi", "*.js", "*.mjs", "*.ts", "*.go", "*.rs",
               "*.java", "*.kt", "*.scala", "*.cs", "*.swift", "*.rb", "*.pl", "*.pm", "*.php",
               "*.lua", "*.sh", "*.bash", "*.zsh", "*.cmake", "*.mk", "*.s", "*.S", "*.asm",
               "*.f90", "*.f", "*.hs", "*.ml", "*.el", "*.scm", "*.sql", "*.awk", "*.sed",
               "CMakeLists.txt", "Makefile", "GNUmakefile", "makefile"]
      - url_path: ["*.c", "*.h", "*.cc", "*.cpp", "*.hpp", "*.py", "*.js", "*.ts", "*.go",
                   "*.rs", "*.java", "*.rb", "*.sh"]

  # Chinese: at least 5% of the letters in the first 8 KiB are CJK characters. One CJK character
  # carries about as much as a 3-5 letter Latin word, so that is roughly every fifth word; Chinese
  # text mixes in Latin names, commands and markup, English text has next to no CJK at all.
  - name: zh
    domain: zh
    cjk_share: 0.05

  # Licences and legal notices: by file name or URL path, or by a licence's title in the first
  # 512 bytes.
  - name: legal-files
    domain: legal
    any:
      - path: ["*/common-licenses/*", "*/doc/*/copyright", "copyright", "LICENSE", "LICENSE.*",
               "LICENCE", "LICENCE.*", "COPYING", "COPYING.*", "NOTICE"]
      - url_path: ["*/common-licenses/*", "*/doc/*/copyright", "*/LICENSE", "*/LICENSE.*",
                   "*/LICENCE", "*/COPYING", "*/COPYING.*"]
  # Code by content: symbol density, statement-like line ends, code keywords (see TAGGING.md).
  - name: code-content
    domain: code
    code_score: 0.5
  # (after code-content: source files often open with a licence header)
  - name: legal-text
    domain: legal
    head_bytes: 512
    head_contains: ["GNU General Public License", "GNU Lesser General Public License",
                    "GNU Library General Public License", "GNU Free Documentation License",
                    "GNU Affero General Public License", "Apache License",
                    "Mozilla Public License", "The \"Artistic License\"",
                    "Creative Commons Legal Code", "Redistribution and use in source and binary",
                    "Permission is hereby granted, free of charge",
                    "copyright-format/1.0", "This package was debianized by"]
)yaml";

}  // namespace kiln::prep
