// template.cpp: the library's edge: parse and render, with every failure (template_failure,
// or an allocation failure) turned into an ordo::error with code "template_error".
#include "template/template.hpp"

#include <new>

#include "template/failure.hpp"
#include "template/lexer.hpp"
#include "template/parser.hpp"
#include "template/renderer.hpp"

namespace ordo::jinja {

namespace {

error to_error(const template_failure& f) {
    std::string where;
    if (f.line != 0) {
        where = "template line " + std::to_string(f.line);
        if (f.column != 0) where += ", column " + std::to_string(f.column);
        where += ": ";
    }
    return make_error(std::string(k_template_error), where + f.message);
}

}  // namespace

result<chat_template> chat_template::parse(std::string_view source, const limits& bounds) {
    if (source.size() > bounds.source_bytes_max) {
        return make_error(std::string(k_template_error),
                          "template is " + std::to_string(source.size()) +
                              " bytes, over the bound of " +
                              std::to_string(bounds.source_bytes_max));
    }
    try {
        chat_template t;
        t._tree = std::make_shared<const parsed>(parse_tokens(tokenize(source), bounds));
        return t;
    } catch (const template_failure& f) {
        return to_error(f);
    } catch (const std::bad_alloc&) {
        return make_error(std::string(k_template_error), "out of memory while parsing");
    }
}

result<std::string> chat_template::render(const variables& vars, const render_options& opt) const {
    if (!_tree) return make_error(std::string(k_template_error), "no template parsed");
    try {
        renderer r(vars, opt);
        return r.run(_tree->statements);
    } catch (const template_failure& f) {
        return to_error(f);
    } catch (const std::bad_alloc&) {
        return make_error(std::string(k_template_error), "out of memory while rendering");
    }
}

}  // namespace ordo::jinja
