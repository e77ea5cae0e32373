package cli

// deployd's: renderDefaultHelp must write what upstream's text/template
// rendering of the default templates writes. printHelpTemplate is upstream
// v2.27.7's printHelpCustom, verbatim but for its name.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"text/tabwriter"
	"text/template"
)

func printHelpTemplate(out io.Writer, templ string, data interface{}, customFuncs map[string]interface{}) {
	const maxLineLength = 10000

	funcMap := template.FuncMap{
		"join":           strings.Join,
		"subtract":       subtract,
		"indent":         indent,
		"nindent":        nindent,
		"trim":           strings.TrimSpace,
		"wrap":           func(input string, offset int) string { return wrap(input, offset, maxLineLength) },
		"offset":         offset,
		"offsetCommands": offsetCommands,
	}

	if customFuncs["wrapAt"] != nil {
		if wa, ok := customFuncs["wrapAt"]; ok {
			if waf, ok := wa.(func() int); ok {
				wrapAt := waf()
				customFuncs["wrap"] = func(input string, offset int) string {
					return wrap(input, offset, wrapAt)
				}
			}
		}
	}

	for key, value := range customFuncs {
		funcMap[key] = value
	}

	w := tabwriter.NewWriter(out, 1, 8, 2, ' ', 0)
	t := template.Must(template.New("help").Funcs(funcMap).Parse(templ))
	templates := map[string]string{
		"helpNameTemplate":                  helpNameTemplate,
		"usageTemplate":                     usageTemplate,
		"descriptionTemplate":               descriptionTemplate,
		"visibleCommandTemplate":            visibleCommandTemplate,
		"copyrightTemplate":                 copyrightTemplate,
		"versionTemplate":                   versionTemplate,
		"visibleFlagCategoryTemplate":       visibleFlagCategoryTemplate,
		"visibleFlagTemplate":               visibleFlagTemplate,
		"visibleGlobalFlagCategoryTemplate": strings.Replace(visibleFlagCategoryTemplate, "OPTIONS", "GLOBAL OPTIONS", -1),
		"authorsTemplate":                   authorsTemplate,
		"visibleCommandCategoryTemplate":    visibleCommandCategoryTemplate,
	}
	for name, value := range templates {
		if _, err := t.New(name).Parse(value); err != nil {
			if os.Getenv("CLI_TEMPLATE_ERROR_DEBUG") != "" {
				_, _ = fmt.Fprintf(ErrWriter, "CLI TEMPLATE ERROR: %#v\n", err)
			}
		}
	}

	err := t.Execute(w, data)
	if err != nil {
		// If the writer is closed, t.Execute will fail, and there's nothing
		// we can do to recover.
		if os.Getenv("CLI_TEMPLATE_ERROR_DEBUG") != "" {
			_, _ = fmt.Fprintf(ErrWriter, "CLI TEMPLATE ERROR: %#v\n", err)
		}
		return
	}
	_ = w.Flush()
}

// helpApps are apps that between them use every part of the default
// templates.
func helpApps() map[string]func() *App {
	sub := func() []*Command {
		return []*Command{
			{Name: "check", Usage: "validate it", Flags: []Flag{&BoolFlag{Name: "strict", Usage: "fail on warnings"}}, Action: func(*Context) error { return nil }},
			{Name: "show", Aliases: []string{"s"}, Usage: "print it", Category: "reading", ArgsUsage: "KEY", Action: func(*Context) error { return nil }},
			{Name: "secret", Hidden: true, Usage: "hidden", Action: func(*Context) error { return nil }},
		}
	}
	return map[string]func() *App{
		"plain": func() *App {
			return &App{Name: "plain", Writer: io.Discard, ErrWriter: io.Discard}
		},
		"full": func() *App {
			return &App{
				Name: "full", Usage: "does everything\nover two lines", Version: "1.2.3",
				Description: "A long description.\n\nWith a blank line and\n  indented text.",
				Copyright:   "(c) someone\nand others",
				Authors:     []*Author{{Name: "Ann", Email: "ann@example.com"}, {Name: "Bob"}},
				Flags: []Flag{
					&StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "config `FILE`", EnvVars: []string{"FULL_CONFIG"}, Value: "x.toml"},
					&BoolFlag{Name: "json", Usage: "print JSON"},
					&DurationFlag{Name: "timeout", Usage: "give up after `D`"},
					&IntFlag{Name: "hidden", Hidden: true},
				},
				Commands: []*Command{
					{Name: "reload", Aliases: []string{"r"}, Usage: "replace workers", ArgsUsage: "[APP...]",
						Description: "Re-reads the config.\nThen rolls.", Flags: []Flag{&StringFlag{Name: "strategy", Value: "rolling", Usage: "how"}},
						Action: func(*Context) error { return nil }},
					{Name: "status", Usage: "show apps", Category: "reading", Args: true, Action: func(*Context) error { return nil }},
					{Name: "logs", Usage: "print logs", Category: "reading", Action: func(*Context) error { return nil }},
					{Name: "config", Usage: "work with the config", Subcommands: sub()},
					{Name: "hidden", Hidden: true, Action: func(*Context) error { return nil }},
				},
				Writer: io.Discard, ErrWriter: io.Discard,
			}
		},
		"single-author-usagetext": func() *App {
			return &App{
				Name: "u", UsageText: "u [options] FILE\n  or u -", HideVersion: true, Version: "9",
				Authors:  []*Author{{Name: "Solo"}},
				Flags:    []Flag{&StringFlag{Name: "out", Category: "output", Usage: "write here"}, &BoolFlag{Name: "q", Category: "output"}, &BoolFlag{Name: "v"}},
				Commands: []*Command{{Name: "x", UsageText: "u x THING", Category: "misc", Flags: []Flag{&BoolFlag{Name: "f", Category: "force"}}, Action: func(*Context) error { return nil }}},
				Writer:   io.Discard, ErrWriter: io.Discard,
			}
		},
		"wrapped": func() *App {
			return &App{
				Name: "w", Usage: strings.Repeat("word ", 30), Description: strings.Repeat("a longer line of description ", 8),
				ExtraInfo: func() map[string]string { return map[string]string{"k": "v"} },
				Commands:  []*Command{{Name: "long", Usage: strings.Repeat("usage ", 25), Action: func(*Context) error { return nil }}},
				Writer:    io.Discard, ErrWriter: io.Discard,
			}
		},
	}
}

// render runs a fresh app with args and returns what it wrote, with
// HelpPrinterCustom set to p.
func render(t *testing.T, mk func() *App, p helpPrinterCustom, wrapAt int, args ...string) string {
	t.Helper()
	saved, savedPrinter := HelpPrinterCustom, HelpPrinter
	defer func() { HelpPrinterCustom, HelpPrinter = saved, savedPrinter }()
	HelpPrinterCustom = p
	if wrapAt > 0 {
		HelpPrinter = func(w io.Writer, templ string, data interface{}) {
			p(w, templ, data, map[string]interface{}{"wrapAt": func() int { return wrapAt }})
		}
	}
	var out bytes.Buffer
	app := mk()
	app.Writer = &out
	app.ExitErrHandler = func(*Context, error) {} // "No help topic" must not exit the test
	_ = app.Run(append([]string{app.Name}, args...))
	return out.String()
}

func TestRenderDefaultHelpMatchesTemplates(t *testing.T) {
	argsets := [][]string{
		{"--help"}, {"-h"}, {"help"}, {},
		{"reload", "--help"}, {"help", "reload"}, {"status", "-h"}, {"logs", "--help"},
		{"config", "--help"}, {"config", "check", "--help"}, {"config", "show", "--help"}, {"config", "help", "show"},
		{"x", "--help"}, {"help", "x"}, {"long", "--help"},
	}
	n := 0
	for name, mk := range helpApps() {
		for _, wrapAt := range []int{0, 40} {
			for _, args := range argsets {
				want := render(t, mk, printHelpTemplate, wrapAt, args...)
				got := render(t, mk, printHelpCustom, wrapAt, args...)
				if got != want {
					t.Errorf("%s %q (wrapAt %d):\n--- text/template ---\n%s\n--- renderDefaultHelp ---\n%s", name, args, wrapAt, want, got)
				}
				if strings.Contains(want, "NAME:") {
					n++
				}
			}
		}
	}
	if n < 40 {
		t.Fatalf("only %d renderings showed help; the test does not exercise the templates", n)
	}
}

// TestHelpOfACommandNotSetUp: upstream's template panicked (and stopped
// after USAGE) on `app help CMD` for a command with subcommands; the
// renderer shows the whole help, as `app CMD --help` does.
func TestHelpOfACommandNotSetUp(t *testing.T) {
	mk := helpApps()["full"]
	got := render(t, mk, printHelpCustom, 0, "help", "config")
	want := render(t, mk, printHelpCustom, 0, "config", "--help")
	if got != want || !strings.Contains(got, "COMMANDS:") {
		t.Fatalf("help config:\n%s\nconfig --help:\n%s", got, want)
	}
}

func TestCustomTemplateIsReported(t *testing.T) {
	var out, errs bytes.Buffer
	saved := ErrWriter
	defer func() { ErrWriter = saved }()
	ErrWriter = &errs
	printHelpCustom(&out, "{{.Name}}", &App{Name: "x"}, nil)
	if out.Len() != 0 || !strings.Contains(errs.String(), "only its default help templates") {
		t.Fatalf("out %q, errors %q", out.String(), errs.String())
	}
}
