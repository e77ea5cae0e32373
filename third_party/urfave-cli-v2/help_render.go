package cli

// This file is deployd's, not upstream's (see DEPLOYD.md): it renders the
// three default help templates (AppHelpTemplate, CommandHelpTemplate,
// SubcommandHelpTemplate) in Go, output for output as text/template renders
// them (help_render_test.go compares the two), so that a program using this
// package does not link text/template's executor. That executor looks
// methods up by a name known only at run time (reflect.Value.MethodByName),
// which makes the Go linker keep every exported method of every type
// converted to an interface in the whole program: 1.75 MB of code in
// deployd, 1.4 MiB of its resident memory.

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
)

// helpFields is what the default templates read of an *App or a *Command.
type helpFields struct {
	app                        bool
	helpName, usage, usageText string
	argsUsage, version         string
	category, description      string
	copyright                  string
	args, hideVersion, hasCmds bool
	authors                    []*Author
	visibleFlags               func() []Flag
	visibleCommands            func() []*Command
	visibleCategories          func() []CommandCategory
	visibleFlagCategories      func() []VisibleFlagCategory
	subcommandTmpl             bool
}

// renderDefaultHelp writes what printHelpCustom's text/template would for
// one of the default templates. It reports false, writing nothing, for any
// other template or data.
func renderDefaultHelp(out io.Writer, templ string, data interface{}, customFuncs map[string]interface{}) bool {
	wrapAt := 10000 // printHelpCustom's maxLineLength
	if wa, ok := customFuncs["wrapAt"].(func() int); ok {
		wrapAt = wa()
	}
	var f helpFields
	switch d := data.(type) {
	case *App:
		if d == nil || templ != AppHelpTemplate {
			return false
		}
		f = helpFields{app: true, helpName: d.HelpName, usage: d.Usage, usageText: d.UsageText,
			argsUsage: d.ArgsUsage, version: d.Version, description: d.Description, copyright: d.Copyright,
			args: d.Args, hideVersion: d.HideVersion, hasCmds: len(d.Commands) > 0, authors: d.Authors,
			visibleFlags: d.VisibleFlags, visibleCommands: d.VisibleCommands,
			visibleCategories: d.VisibleCategories, visibleFlagCategories: d.VisibleFlagCategories}
		if d.categories == nil { // an App never set up (its Run does)
			f.visibleCategories = func() []CommandCategory { return categoriesOf(d.Commands) }
		}
	case *Command:
		if d == nil {
			return false
		}
		switch templ {
		case CommandHelpTemplate:
		case SubcommandHelpTemplate:
			f.subcommandTmpl = true
		default:
			return false
		}
		f.helpName, f.usage, f.usageText, f.argsUsage = d.HelpName, d.Usage, d.UsageText, d.ArgsUsage
		f.category, f.description, f.args = d.Category, d.Description, d.Args
		f.visibleFlags, f.visibleCommands = d.VisibleFlags, d.VisibleCommands
		f.visibleCategories, f.visibleFlagCategories = d.VisibleCategories, d.VisibleFlagCategories
		if d.categories == nil {
			// `app help CMD` shows a command that was never set up: the
			// template's VisibleCategories panicked there, and its help
			// stopped after USAGE. Its categories are what setup makes.
			f.visibleCategories = func() []CommandCategory { return categoriesOf(d.Subcommands) }
		}
	default:
		return false
	}
	wrapF := func(s string, offset int) string { return wrap(s, offset, wrapAt) }
	var b strings.Builder
	// helpNameTemplate
	b.WriteString("NAME:\n   ")
	b.WriteString(wrapF(f.helpName, 3))
	if f.usage != "" {
		b.WriteString(" - ")
		b.WriteString(wrapF(f.usage, offset(f.helpName, 6)))
	}
	b.WriteString("\n\nUSAGE:\n   ")
	switch {
	case f.usageText != "":
		b.WriteString(wrapF(f.usageText, 3))
	case f.app:
		b.WriteString(f.helpName + " ")
		if len(f.visibleFlags()) > 0 {
			b.WriteString("[global options]")
		}
		if f.hasCmds {
			b.WriteString(" command [command options]")
		}
		writeArgsUsage(&b, f)
	default: // usageTemplate
		b.WriteString(f.helpName)
		if len(f.visibleFlags()) > 0 {
			b.WriteString(" [command options]")
		}
		writeArgsUsage(&b, f)
	}
	if f.app {
		if f.version != "" && !f.hideVersion {
			b.WriteString("\n\nVERSION:\n   " + f.version)
		}
	} else if f.category != "" {
		b.WriteString("\n\nCATEGORY:\n   " + f.category)
	}
	if f.description != "" {
		b.WriteString("\n\nDESCRIPTION:\n   ")
		b.WriteString(wrapF(f.description, 3))
	}
	if f.app && len(f.authors) > 0 { // authorsTemplate
		b.WriteString("\n\nAUTHOR")
		if len(f.authors) != 1 {
			b.WriteString("S")
		}
		b.WriteString(":\n   ")
		for i, a := range f.authors {
			if i > 0 {
				b.WriteString("\n   ")
			}
			if a == nil {
				b.WriteString("<nil>") // fmt's nil *Author
			} else {
				b.WriteString(a.String())
			}
		}
	}
	if (f.app || f.subcommandTmpl) && len(f.visibleCommands()) > 0 {
		b.WriteString("\n\nCOMMANDS:")
		writeCommandCategories(&b, f.visibleCategories(), wrapF)
	}
	opts := "OPTIONS:"
	if f.app {
		opts = "GLOBAL OPTIONS:"
	}
	if cats := f.visibleFlagCategories(); len(cats) > 0 { // visibleFlagCategoryTemplate
		b.WriteString("\n\n" + opts)
		for _, c := range cats {
			b.WriteString("\n   ")
			if c.Name() != "" {
				b.WriteString(c.Name() + "\n\n   ")
			}
			flags := c.Flags()
			for i, e := range flags {
				b.WriteString(fmt.Sprint(e))
				if len(flags)-i == 1 {
					b.WriteString("\n")
				} else {
					b.WriteString("\n   ")
				}
			}
		}
	} else if flags := f.visibleFlags(); len(flags) > 0 { // visibleFlagTemplate
		b.WriteString("\n\n" + opts)
		for _, e := range flags {
			b.WriteString("\n   ")
			b.WriteString(wrapF(e.String(), 6))
		}
	}
	if f.app && f.copyright != "" {
		b.WriteString("\n\nCOPYRIGHT:\n   ")
		b.WriteString(wrapF(f.copyright, 3))
	}
	b.WriteString("\n")
	w := tabwriter.NewWriter(out, 1, 8, 2, ' ', 0)
	if _, err := io.WriteString(w, b.String()); err != nil {
		if os.Getenv("CLI_TEMPLATE_ERROR_DEBUG") != "" {
			_, _ = fmt.Fprintf(ErrWriter, "CLI TEMPLATE ERROR: %#v\n", err)
		}
		return true
	}
	_ = w.Flush()
	return true
}

// writeArgsUsage is the templates' {{if .ArgsUsage}} {{.ArgsUsage}}{{else}}
// {{if .Args}} [arguments...]{{end}}{{end}}.
func writeArgsUsage(b *strings.Builder, f helpFields) {
	if f.argsUsage != "" {
		b.WriteString(" " + f.argsUsage)
	} else if f.args {
		b.WriteString(" [arguments...]")
	}
}

// writeCommandCategories is visibleCommandCategoryTemplate, with
// visibleCommandTemplate for the unnamed category.
func writeCommandCategories(b *strings.Builder, cats []CommandCategory, wrapF func(string, int) string) {
	for _, c := range cats {
		if c.Name() != "" {
			b.WriteString("\n   " + c.Name() + ":")
			for _, cmd := range c.VisibleCommands() {
				b.WriteString("\n     " + strings.Join(cmd.Names(), ", ") + "\t" + cmd.Usage)
			}
			continue
		}
		cmds := c.VisibleCommands()
		cv := offsetCommands(cmds, 5)
		for _, cmd := range cmds {
			s := strings.Join(cmd.Names(), ", ")
			b.WriteString("\n   " + s)
			b.WriteString(indent(subtract(cv, offset(s, 3)), ""))
			b.WriteString(wrapF(cmd.Usage, cv))
		}
	}
}

// categoriesOf is the visible categories of cmds as an App's or a
// Command's setup sorts them.
func categoriesOf(cmds []*Command) []CommandCategory {
	cats := newCommandCategories()
	for _, sc := range cmds {
		cats.AddCommand(sc.Category, sc)
	}
	sort.Sort(cats.(*commandCategories))
	var ret []CommandCategory
	for _, c := range cats.Categories() {
		if len(c.VisibleCommands()) > 0 {
			ret = append(ret, c)
		}
	}
	return ret
}
