// tcstage.halide._native -- a thin bridge from Python to a few of Halide's
// internal symbolic routines (the solver, the simplifier and the
// condition-over-domain relaxation), built against the libHalide.so that the
// `halide` PyPI wheel ships.
//
// Inputs are `halide.Expr` objects (obtained from the halide Python bindings
// through pybind11's cross-extension "conduit"), or plain Python ints, which
// become int32 constants.  Outputs are plain Python data: nested tuples whose
// first element is a short string tag.  Nothing is ever returned as text that
// would need re-parsing.
//
// TREE FORMAT (a contract that other modules of tcstage depend on):
//
//   Constants whose type is not int32, float32 or bool are wrapped as
//   ('cast', type_str, ('int' | 'float', v)), v holding the full value.
//   ('int', v)                 IntImm / UIntImm.  v is a Python int, except
//                              for boolean (uint1) constants, where v is the
//                              Python bool True / False (bool is a subclass of
//                              int, so ('int', True) == ('int', 1) holds).
//   ('float', v)               FloatImm; v is a Python float.
//   ('var', name)              Variable.
//   (op, a, b)                 binary node, op one of
//                                'add' 'sub' 'mul' 'div' 'mod' 'min' 'max'
//                                'eq' 'ne' 'lt' 'le' 'gt' 'ge' 'and' 'or'
//                              ('div' / 'mod' carry Halide's semantics:
//                              Euclidean, rounding down for a positive divisor,
//                              x/0 == 0 and x%0 == 0.)
//   ('not', a)                 logical negation.
//   ('select', c, t, f)        c ? t : f.
//   ('cast', type_str, a)      conversion; type_str like 'int32', 'uint8',
//                              'float32', 'bool' ('<type>x<lanes>' for a
//                              vector type).
//   ('read', name, (args...))  a read of a Func or an input buffer (Call of
//                              type Halide or Image); name is the Func's or
//                              the buffer's name, args innermost first.
//   ('call', name, (args...))  any other Call node (intrinsics, math, extern
//                              calls); args is a tuple of trees.
//   ('let', name, value, body) Let expression.
//
// Any other node (StringImm, Broadcast, Ramp, Load, Shuffle, Reinterpret,
// VectorReduce, ...) makes the conversion raise a Python ValueError naming the
// node type.

#include <Halide.h>

#include <pybind11/conduit/pybind11_conduit_v1.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace py = pybind11;
using Halide::Expr;
namespace HI = Halide::Internal;

namespace {

// ---------------------------------------------------------------------------
// Python -> Halide::Expr

// Converts an argument coming from Python into an Expr.  `what` names the
// argument in error messages.
Expr expr_from_py(const py::handle &obj, const char *what) {
    if (obj.is_none()) {
        throw py::type_error(std::string(what) +
                             ": expected a halide.Expr or an int, got None");
    }
    // bool must be tested before int (it is an int subclass in Python).
    if (PyBool_Check(obj.ptr())) {
        return HI::make_bool(obj.ptr() == Py_True);
    }
    if (PyLong_Check(obj.ptr())) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
        if (overflow != 0 || v < INT32_MIN || v > INT32_MAX) {
            throw py::value_error(std::string(what) +
                                  ": integer does not fit in int32");
        }
        return Expr(static_cast<int32_t>(v));
    }
    Expr *p = pybind11_conduit_v1::get_type_pointer_ephemeral<Expr>(obj.ptr());
    if (p == nullptr) {
        // The conduit may leave a Python error set when the object has a
        // _pybind11_conduit_v1_ attribute of an unexpected kind.
        PyErr_Clear();
        std::string tname = py::str(py::type::handle_of(obj).attr("__name__"));
        throw py::type_error(std::string(what) +
                             ": expected a halide.Expr (import halide as hl; "
                             "hl.Expr(...)) or a Python int, got an object of type '" +
                             tname + "'");
    }
    if (!p->defined()) {
        throw py::value_error(std::string(what) + ": the halide.Expr is undefined");
    }
    return *p;  // copy: the pointer only lives as long as the Python object
}

// ---------------------------------------------------------------------------
// Halide::Expr -> tree

std::string type_to_str(const Halide::Type &t) {
    std::ostringstream s;
    if (t.is_bool()) {
        s << "bool";
    } else {
        switch (t.code()) {
        case Halide::Type::Int:
            s << "int";
            break;
        case Halide::Type::UInt:
            s << "uint";
            break;
        case Halide::Type::Float:
            s << "float";
            break;
        case Halide::Type::BFloat:
            s << "bfloat";
            break;
        case Halide::Type::Handle:
            s << "handle";
            break;
        }
        s << t.bits();
    }
    if (t.lanes() != 1) {
        s << "x" << t.lanes();
    }
    return s.str();
}

std::string node_type_name(HI::IRNodeType t) {
    std::ostringstream s;
    s << t;  // Halide provides operator<< for IRNodeType
    return s.str();
}

py::object to_tree(const Expr &e);

template<typename Node>
py::object binary(const char *tag, const Expr &e) {
    const Node *n = e.as<Node>();
    return py::make_tuple(tag, to_tree(n->a), to_tree(n->b));
}

py::object to_tree(const Expr &e) {
    if (!e.defined()) {
        throw py::value_error("cannot convert an undefined Halide Expr to a tree");
    }
    // Constants of a type other than int32, float32 or bool come wrapped in a cast to their
    // type, with the full value inside, so a code generator can type every node.
    auto typed = [&](py::object constant) -> py::object {
        const Halide::Type &t = e.type();
        bool natural = t == Halide::Int(32) || t == Halide::Float(32) || t.is_bool();
        return natural ? constant : py::make_tuple("cast", type_to_str(t), constant);
    };
    switch (e->node_type) {
    case HI::IRNodeType::IntImm:
        return typed(py::make_tuple("int", py::int_(static_cast<long long>(e.as<HI::IntImm>()->value))));
    case HI::IRNodeType::UIntImm: {
        const HI::UIntImm *n = e.as<HI::UIntImm>();
        if (n->type.is_bool()) {
            return py::make_tuple("int", py::bool_(n->value != 0));
        }
        return typed(py::make_tuple("int", py::int_(static_cast<unsigned long long>(n->value))));
    }
    case HI::IRNodeType::FloatImm:
        return typed(py::make_tuple("float", py::float_(e.as<HI::FloatImm>()->value)));
    case HI::IRNodeType::Variable:
        return py::make_tuple("var", e.as<HI::Variable>()->name);
    case HI::IRNodeType::Cast: {
        const HI::Cast *n = e.as<HI::Cast>();
        return py::make_tuple("cast", type_to_str(n->type), to_tree(n->value));
    }
    case HI::IRNodeType::Reinterpret: {
        // Lowering stores uint64 as int64; between integers of one width a reinterpretation
        // keeps the bits, which is what a C cast between them does too.
        const HI::Reinterpret *n = e.as<HI::Reinterpret>();
        const Halide::Type from = n->value.type(), to = n->type;
        if ((from.is_int() || from.is_uint()) && (to.is_int() || to.is_uint()) &&
            from.bits() == to.bits() && from.lanes() == to.lanes()) {
            return py::make_tuple("cast", type_to_str(to), to_tree(n->value));
        }
        // A double scalar input travels to the CPU as its int64 bits (lowering's set_scalar);
        // elsewhere it is the scalar itself.
        if (from == Halide::Int(64) && to == Halide::Float(64) && n->value.as<HI::Variable>()) {
            return to_tree(n->value);
        }
        // Any other one (fast_exp's and random_float's bit tricks) keeps the bits as a call
        // the code generator prints as a copy of them.
        if (from.bits() == to.bits() && from.lanes() == 1 && to.lanes() == 1) {
            return py::make_tuple("call", "reinterpret_" + type_to_str(to),
                                  py::make_tuple(to_tree(n->value)));
        }
        throw std::invalid_argument("cannot convert a reinterpretation from " +
                                    type_to_str(from) + " to " + type_to_str(to) +
                                    " to a tcstage tree");
    }
    case HI::IRNodeType::Add:
        return binary<HI::Add>("add", e);
    case HI::IRNodeType::Sub:
        return binary<HI::Sub>("sub", e);
    case HI::IRNodeType::Mul:
        return binary<HI::Mul>("mul", e);
    case HI::IRNodeType::Div:
        return binary<HI::Div>("div", e);
    case HI::IRNodeType::Mod:
        return binary<HI::Mod>("mod", e);
    case HI::IRNodeType::Min:
        return binary<HI::Min>("min", e);
    case HI::IRNodeType::Max:
        return binary<HI::Max>("max", e);
    case HI::IRNodeType::EQ:
        return binary<HI::EQ>("eq", e);
    case HI::IRNodeType::NE:
        return binary<HI::NE>("ne", e);
    case HI::IRNodeType::LT:
        return binary<HI::LT>("lt", e);
    case HI::IRNodeType::LE:
        return binary<HI::LE>("le", e);
    case HI::IRNodeType::GT:
        return binary<HI::GT>("gt", e);
    case HI::IRNodeType::GE:
        return binary<HI::GE>("ge", e);
    case HI::IRNodeType::And:
        return binary<HI::And>("and", e);
    case HI::IRNodeType::Or:
        return binary<HI::Or>("or", e);
    case HI::IRNodeType::Not:
        return py::make_tuple("not", to_tree(e.as<HI::Not>()->a));
    case HI::IRNodeType::Select: {
        const HI::Select *n = e.as<HI::Select>();
        return py::make_tuple("select", to_tree(n->condition), to_tree(n->true_value),
                              to_tree(n->false_value));
    }
    case HI::IRNodeType::Call: {
        const HI::Call *n = e.as<HI::Call>();
        // Intrinsics with an arithmetic definition become that arithmetic (Halide's own
        // lowering), so back ends print only basic operations: mux is a select chain,
        // saturating casts, widening, halving and rounding operations are casts and clamps.
        if (n->is_intrinsic(HI::Call::mux)) {
            return to_tree(HI::lower_mux(n));
        }
        // An integer lerp is Halide's exact fixed-point formula (the float one a back end
        // prints itself)
        if (n->is_intrinsic(HI::Call::lerp) && !n->type.is_float()) {
            return to_tree(HI::lower_lerp(n->type, n->args[0], n->args[1], n->args[2],
                                          Halide::get_host_target()));
        }
        if (n->call_type == HI::Call::PureIntrinsic && !n->is_intrinsic(HI::Call::lerp) &&
            !n->is_intrinsic(HI::Call::absd) && !n->is_intrinsic(HI::Call::likely) &&
            !n->is_intrinsic(HI::Call::likely_if_innermost)) {
            Expr lowered = HI::lower_intrinsic(n);
            if (lowered.defined() && !lowered.same_as(e)) {
                return to_tree(lowered);
            }
        }
        py::tuple args(n->args.size());
        for (size_t i = 0; i < n->args.size(); i++) {
            args[i] = to_tree(n->args[i]);
        }
        bool is_read = n->call_type == HI::Call::Halide || n->call_type == HI::Call::Image;
        // A Tuple element reads as a Func of its own, `name#index` (the polyhedral flow makes
        // each element a tensor)
        if (n->call_type == HI::Call::Halide && n->func.defined() &&
            HI::Function(n->func).outputs() > 1) {
            return py::make_tuple("read", n->name + "#" + std::to_string(n->value_index), args);
        }
        return py::make_tuple(is_read ? "read" : "call", n->name, args);
    }
    case HI::IRNodeType::Let: {
        const HI::Let *n = e.as<HI::Let>();
        return py::make_tuple("let", n->name, to_tree(n->value), to_tree(n->body));
    }
    default:
        throw py::value_error("cannot convert Halide IR node of type " +
                              node_type_name(e->node_type) +
                              " to a tcstage tree (unsupported node)");
    }
}

// ---------------------------------------------------------------------------
// Helpers around the Halide routines

// Halide reports errors by throwing Halide::Error, which does not derive from
// std::exception; turn it into a Python RuntimeError carrying its message.
template<typename F>
auto guarded(F &&f) -> decltype(f()) {
    try {
        return f();
    } catch (const Halide::Error &err) {
        std::string msg = err.what();
        while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) {
            msg.pop_back();
        }
        PyErr_SetString(PyExc_RuntimeError, ("Halide error: " + msg).c_str());
        throw py::error_already_set();
    }
}

void require_bool(const Expr &e, const char *what) {
    if (!e.type().is_bool() || e.type().lanes() != 1) {
        throw py::type_error(std::string(what) +
                             ": expected a scalar boolean condition, got an expression of type " +
                             type_to_str(e.type()));
    }
}

void require_int(const Expr &e, const char *what) {
    if (!(e.type().is_int() || e.type().is_uint()) || e.type().is_bool() ||
        e.type().lanes() != 1) {
        throw py::type_error(std::string(what) +
                             ": expected a scalar integer expression, got an expression of type " +
                             type_to_str(e.type()));
    }
}

// True if `e` mentions Halide's symbolic infinities anywhere.
bool mentions_infinity(const Expr &e) {
    return HI::expr_uses_var(e, "pos_inf") || HI::expr_uses_var(e, "neg_inf");
}

py::object bound_tree(const Expr &b, const char *which) {
    Expr s = guarded([&] { return HI::simplify(b); });
    if (mentions_infinity(s)) {
        throw py::value_error(std::string("solve_for_inner_interval: the ") + which +
                              " bound still involves an infinity after simplification");
    }
    return to_tree(s);
}

Expr *out_expr(const py::object &obj, const char *what) {
    Expr *out = pybind11_conduit_v1::get_type_pointer_ephemeral<Expr>(obj.ptr());
    if (out == nullptr) {
        PyErr_Clear();
        throw py::type_error(std::string(what) + ": expected a halide.Expr to write into");
    }
    return out;
}

// Lets for expressions that name a value more than once (C's fmax tests its operands for
// NaN, then picks one): the value is written once, so a chain of n nested uses stays n deep
// instead of growing as k^n as a tree, which is_nan (it rebuilds its argument strict) and
// every later pass would walk in full. Each result is written into `out`, an Expr the caller
// made: Halide's bindings give this module no way to return a new one.
void py_variable(const py::object &out, const std::string &name, const py::object &like) {
    Expr e = expr_from_py(like, "variable(like)");
    *out_expr(out, "variable(out)") = HI::Variable::make(e.type(), name);
}

void py_let(const py::object &out, const std::string &name, const py::object &value,
            const py::object &body) {
    Expr v = expr_from_py(value, "let(value)"), b = expr_from_py(body, "let(body)");
    *out_expr(out, "let(out)") = HI::Let::make(name, v, b);
}

// A call of a C math function of one argument that Halide has no intrinsic for (double
// erf): opaque to Halide's simplifier and bounds inference, which a spelled-out polynomial is
// not; compiled as a call of the C library's function of that name.
void py_math_call(const py::object &out, const std::string &name, const py::object &arg) {
    Expr a = expr_from_py(arg, "math_call(arg)");
    *out_expr(out, "math_call(out)") = HI::Call::make(a.type(), name, {a},
                                                       HI::Call::PureExtern);
}

py::object py_to_tree(const py::object &obj) {
    Expr e = expr_from_py(obj, "to_tree");
    return to_tree(e);
}

py::object py_simplify(const py::object &obj) {
    Expr e = expr_from_py(obj, "simplify");
    Expr s = guarded([&] { return HI::simplify(e); });
    return to_tree(s);
}

py::tuple py_solve_for_inner_interval(const py::object &cond_obj, const std::string &var) {
    Expr cond = expr_from_py(cond_obj, "solve_for_inner_interval(cond)");
    require_bool(cond, "solve_for_inner_interval(cond)");
    if (var.empty()) {
        throw py::value_error("solve_for_inner_interval: variable name must not be empty");
    }
    HI::Interval iv = guarded([&] { return HI::solve_for_inner_interval(cond, var); });
    if (iv.is_empty()) {
        // The condition is never known to hold: report an empty range in the
        // inclusive convention (lo > hi), which iterates zero times.
        return py::make_tuple(py::make_tuple("int", 1), py::make_tuple("int", 0));
    }
    py::object lo = py::none(), hi = py::none();
    if (iv.has_lower_bound()) {
        lo = bound_tree(iv.min, "lower");
    }
    if (iv.has_upper_bound()) {
        hi = bound_tree(iv.max, "upper");
    }
    return py::make_tuple(lo, hi);
}

py::object py_and_condition_over_domain(const py::object &cond_obj, const py::dict &domain) {
    Expr cond = expr_from_py(cond_obj, "and_condition_over_domain(cond)");
    require_bool(cond, "and_condition_over_domain(cond)");
    HI::Scope<HI::Interval> scope;
    for (auto item : domain) {
        if (!py::isinstance<py::str>(item.first)) {
            throw py::type_error("and_condition_over_domain: domain keys must be variable names (str)");
        }
        std::string name = py::cast<std::string>(item.first);
        py::object bounds = py::reinterpret_borrow<py::object>(item.second);
        if (!py::isinstance<py::sequence>(bounds) || py::len(bounds) != 2) {
            throw py::type_error("and_condition_over_domain: domain['" + name +
                                 "'] must be a (lo, hi) pair of inclusive bounds");
        }
        py::sequence seq = bounds.cast<py::sequence>();
        std::string what_lo = "and_condition_over_domain(domain['" + name + "'][0])";
        std::string what_hi = "and_condition_over_domain(domain['" + name + "'][1])";
        Expr lo = expr_from_py(seq[0], what_lo.c_str());
        Expr hi = expr_from_py(seq[1], what_hi.c_str());
        require_int(lo, what_lo.c_str());
        require_int(hi, what_hi.c_str());
        scope.push(name, HI::Interval(lo, hi));
    }
    Expr r = guarded([&] {
        Expr relaxed = HI::and_condition_over_domain(cond, scope);
        return HI::simplify(relaxed);
    });
    return to_tree(r);
}

// ---------------------------------------------------------------------------
// Func definitions -> Python data (what the polyhedral middle end reads)

py::tuple trees(const std::vector<Expr> &exprs) {
    py::tuple out(exprs.size());
    for (size_t i = 0; i < exprs.size(); i++) {
        out[i] = to_tree(exprs[i]);
    }
    return out;
}

py::dict definition_to_py(const HI::Definition &d, bool pure) {
    py::dict out;
    out["kind"] = pure ? "pure" : "update";
    out["args"] = trees(d.args());
    out["values"] = trees(d.values());
    out["predicate"] = to_tree(d.predicate());
    const std::vector<HI::ReductionVariable> &rvars = d.schedule().rvars();
    py::tuple rv(rvars.size());
    for (size_t i = 0; i < rvars.size(); i++) {
        rv[i] = py::make_tuple(rvars[i].var, to_tree(rvars[i].min), to_tree(rvars[i].extent));
    }
    out["rvars"] = rv;  // innermost first, as Halide loops over them
    return out;
}

py::dict py_func_definitions(const py::object &func_obj) {
    Halide::Func *f = pybind11_conduit_v1::get_type_pointer_ephemeral<Halide::Func>(func_obj.ptr());
    if (f == nullptr) {
        PyErr_Clear();
        std::string tname = py::str(py::type::handle_of(func_obj).attr("__name__"));
        throw py::type_error("func_definitions: expected a halide.Func, got an object of type '" +
                             tname + "'");
    }
    if (!f->defined()) {
        throw py::value_error("func_definitions: the halide.Func '" + f->name() + "' has no definition");
    }
    HI::Function fn = f->function();
    py::list defs;
    defs.append(definition_to_py(fn.definition(), true));
    for (const HI::Definition &u : fn.updates()) {
        defs.append(definition_to_py(u, false));
    }
    py::dict out;
    out["name"] = fn.name();
    out["args"] = py::cast(fn.args());  // pure argument names, innermost first
    out["definitions"] = defs;
    return out;
}


HI::Function function_of(const py::handle &obj, const char *what) {
    Halide::Func *f = pybind11_conduit_v1::get_type_pointer_ephemeral<Halide::Func>(obj.ptr());
    if (f == nullptr) {
        PyErr_Clear();
        std::string tname = py::str(py::type::handle_of(obj).attr("__name__"));
        throw py::type_error(std::string(what) + ": expected a halide.Func, got an object of type '" +
                             tname + "'");
    }
    if (!f->defined()) {
        throw py::value_error(std::string(what) + ": the halide.Func '" + f->name() +
                              "' has no definition");
    }
    return f->function();
}

std::vector<HI::Function> functions_of(const py::sequence &outputs, const char *what) {
    std::vector<HI::Function> out;
    for (const py::handle &o : outputs) {
        out.push_back(function_of(o, what));
    }
    return out;
}

py::dict function_to_py(const HI::Function &fn) {
    py::list defs;
    py::list types;
    for (const Halide::Type &t : fn.output_types()) {
        types.append(type_to_str(t));
    }
    py::dict out;
    out["name"] = fn.name();
    out["args"] = py::cast(fn.args());  // pure argument names, innermost first
    out["types"] = types;
    out["extern"] = fn.has_extern_definition();
    if (!fn.has_extern_definition()) {
        defs.append(definition_to_py(fn.definition(), true));
        for (const HI::Definition &u : fn.updates()) {
            defs.append(definition_to_py(u, false));
        }
    }
    out["definitions"] = defs;
    return out;
}

// The pipeline's Functions as copies, with their environment: Halide's realization_order
// records compute_with's fused pairs in the schedules it is given (its own lowering works on
// copies too), so the caller's Funcs must never reach it.
std::map<std::string, HI::Function> copied_environment(std::vector<HI::Function> &outs) {
    auto copies = HI::deep_copy(outs, HI::build_environment(outs));
    outs = copies.first;
    return copies.second;
}

// Every Func a pipeline computes, producers first (Halide's realization order), as plain data.
py::list py_pipeline_functions(const py::sequence &outputs) {
    return guarded([&] {
        std::vector<HI::Function> outs = functions_of(outputs, "pipeline_functions");
        std::map<std::string, HI::Function> env = copied_environment(outs);
        std::vector<std::string> order = HI::realization_order(outs, env).first;
        py::list result;
        for (const std::string &name : order) {
            result.append(function_to_py(env.at(name)));
        }
        return result;
    });
}

// Halide's bounds inference, backward from the outputs' boxes: the region each Func must be
// computed over (its consumers' needs, widened by what its own updates read and write), and
// the region of each input buffer that is read. `known` gives values (or intervals) of free
// variables: input mins and extents, scalar params.
py::dict py_required_regions(const py::sequence &outputs, const py::sequence &boxes,
                             const py::dict &known) {
    std::vector<HI::Function> outs = functions_of(outputs, "required_regions");
    if (py::len(boxes) != outs.size()) {
        throw py::value_error("required_regions: one box per output is needed");
    }
    HI::Scope<HI::Interval> base;
    std::map<std::string, Expr> values;  // the known variables with one value
    for (auto item : known) {
        std::string name = py::str(item.first);
        std::string what = "required_regions(known['" + name + "'])";
        if (py::isinstance<py::tuple>(item.second)) {
            py::tuple b = item.second.cast<py::tuple>();
            base.push(name, HI::Interval(expr_from_py(b[0], what.c_str()),
                                         expr_from_py(b[1], what.c_str())));
        } else {
            Expr v = expr_from_py(item.second, what.c_str());
            base.push(name, HI::Interval(v, v));
            values[name] = v;
        }
    }
    std::map<std::string, HI::Box> required;
    for (size_t i = 0; i < outs.size(); i++) {
        py::sequence box = boxes[i].cast<py::sequence>();
        HI::Box b;
        for (const py::handle &iv : box) {
            py::sequence pair = iv.cast<py::sequence>();
            b.bounds.emplace_back(expr_from_py(pair[0], "required_regions(box min)"),
                                  expr_from_py(pair[1], "required_regions(box max)"));
        }
        if (b.size() != outs[i].dimensions()) {
            throw py::value_error("required_regions: the box of output '" + outs[i].name() +
                                  "' has " + std::to_string(b.size()) + " dimensions, the Func " +
                                  std::to_string(outs[i].dimensions()));
        }
        required[outs[i].name()] = b;
    }
    return guarded([&] {
        std::map<std::string, HI::Function> env = copied_environment(outs);
        std::vector<std::string> order = HI::realization_order(outs, env).first;
        HI::FuncValueBounds value_bounds = HI::compute_function_value_bounds(order, env);
        auto add = [&](const std::map<std::string, HI::Box> &found) {
            for (const auto &p : found) {
                auto it = required.find(p.first);
                if (it == required.end()) {
                    required[p.first] = p.second;
                } else {
                    HI::merge_boxes(it->second, p.second);
                }
            }
        };
        py::dict result;
        for (auto it = order.rbegin(); it != order.rend(); ++it) {
            const HI::Function &f = env.at(*it);
            if (!required.count(f.name())) {
                continue;  // nothing reads it within the outputs' boxes
            }
            if (f.has_extern_definition()) {
                throw std::invalid_argument("Func '" + f.name() + "' has an extern definition");
            }
            // Updates first: they may read or write the Func beyond what consumers need, and
            // the pure definition must then cover that too. Halide computes every stage over
            // the Func's region; so does the polyhedral model built from this.
            std::vector<HI::Definition> defs{f.definition()};
            for (const HI::Definition &u : f.updates()) {
                defs.push_back(u);
            }
            for (int pass = 0; pass < 2; pass++) {  // a second pass sees the widened region
                for (size_t d = defs.size(); d-- > 0;) {
                    const HI::Definition &def = defs[d];
                    HI::Scope<HI::Interval> scope;
                    scope.set_containing_scope(&base);
                    const HI::Box &region = required.at(f.name());
                    for (size_t k = 0; k < f.args().size(); k++) {
                        scope.push(f.args()[k], region[k]);
                    }
                    for (const HI::ReductionVariable &rv : def.schedule().rvars()) {
                        Expr lo = HI::simplify(HI::substitute(values, rv.min));
                        Expr extent = HI::simplify(HI::substitute(values, rv.extent));
                        scope.push(rv.var, HI::Interval(lo, HI::simplify(lo + extent - 1)));
                    }
                    std::vector<Expr> exprs = def.values();
                    for (const Expr &a : def.args()) {
                        exprs.push_back(a);
                    }
                    exprs.push_back(def.predicate());
                    for (const Expr &e : exprs) {
                        add(HI::boxes_required(e, scope, value_bounds));
                    }
                    if (d > 0) {  // what an update writes
                        HI::Box touched;
                        for (const Expr &a : def.args()) {
                            touched.bounds.push_back(HI::bounds_of_expr_in_scope(a, scope, value_bounds));
                        }
                        add({{f.name(), touched}});
                    }
                }
            }
        }
        for (const auto &p : required) {
            py::list dims;
            for (const HI::Interval &iv : p.second.bounds) {
                py::object lo = iv.has_lower_bound()
                    ? to_tree(HI::simplify(HI::substitute(values, iv.min))) : py::none();
                py::object hi = iv.has_upper_bound()
                    ? to_tree(HI::simplify(HI::substitute(values, iv.max))) : py::none();
                dims.append(py::make_tuple(lo, hi));
            }
            result[py::str(p.first)] = dims;
        }
        return result;
    });
}

// The Funcs of the pipeline (outputs excluded) that are computed inline: Halide's default
// when nothing scheduled them.
py::list py_inlined_functions(const py::sequence &outputs) {
    return guarded([&] {
        std::vector<HI::Function> outs = functions_of(outputs, "inlined_functions");
        std::map<std::string, HI::Function> env = HI::build_environment(outs);
        std::set<std::string> output_names;
        for (const HI::Function &f : outs) {
            output_names.insert(f.name());
        }
        py::list names;
        for (const auto &p : env) {
            Halide::LoopLevel level = p.second.schedule().compute_level();
            level.lock();  // (a copy: the Func's own level stays open to scheduling)
            if (!output_names.count(p.first) && level.is_inlined()) {
                names.append(p.first);
            }
        }
        return names;
    });
}

// Computes the named Funcs of the pipeline at the root (as Func::compute_root does), which
// Python cannot reach for Funcs it holds no handle to.
void py_compute_root(const py::sequence &outputs, const std::vector<std::string> &names) {
    guarded([&] {
        std::vector<HI::Function> outs = functions_of(outputs, "compute_root");
        std::map<std::string, HI::Function> env = HI::build_environment(outs);
        for (const std::string &name : names) {
            auto it = env.find(name);
            if (it == env.end()) {
                throw std::invalid_argument("compute_root: no Func '" + name + "' in the pipeline");
            }
            it->second.schedule().compute_level() = Halide::LoopLevel::root();
            it->second.schedule().store_level() = Halide::LoopLevel::root();
        }
        return 0;
    });
}

// Names of the pipeline's Funcs that carry a schedule: a stage with a split or a loop that is
// not serial (vectorize, parallel, unroll, gpu_*), or an intermediate Func not computed
// inline. Reordering alone does not count: it changes no work.
py::list py_scheduled_functions(const py::sequence &outputs) {
    return guarded([&] {
        std::vector<HI::Function> outs = functions_of(outputs, "scheduled_functions");
        std::map<std::string, HI::Function> env = HI::build_environment(outs);
        std::set<std::string> output_names;
        for (const HI::Function &f : outs) {
            output_names.insert(f.name());
        }
        auto stage_scheduled = [](const HI::Definition &d) {
            const HI::StageSchedule &s = d.schedule();
            if (!s.splits().empty()) {
                return true;
            }
            for (const HI::Dim &dim : s.dims()) {
                if (dim.for_type != HI::ForType::Serial) {
                    return true;
                }
            }
            return false;
        };
        py::list names;
        for (const auto &p : env) {
            const HI::Function &f = p.second;
            Halide::LoopLevel level = f.schedule().compute_level();
            level.lock();  // (a copy: the Func's own level stays open to scheduling)
            bool scheduled = !output_names.count(p.first) && !level.is_inlined();
            if (!f.has_extern_definition()) {
                scheduled = scheduled || stage_scheduled(f.definition());
                for (const HI::Definition &u : f.updates()) {
                    scheduled = scheduled || stage_scheduled(u);
                }
            }
            if (scheduled) {
                names.append(p.first);
            }
        }
        return names;
    });
}

// Replaces the named variables (an input's extent, `A.extent.0`) by constants.
class ConstantSubstituter : public HI::IRMutator {
public:
    explicit ConstantSubstituter(std::map<std::string, int64_t> values) : values(std::move(values)) {}

protected:
    using HI::IRMutator::visit;
    Expr visit(const HI::Variable *op) override {
        auto it = values.find(op->name);
        if (it == values.end() || !op->type.is_int()) {
            return op;
        }
        return HI::make_const(op->type, it->second);
    }

private:
    std::map<std::string, int64_t> values;
};

// Copies the whole pipeline (definitions and schedules; Params and ImageParams stay shared)
// and writes the copies of the Funcs `into` names (name -> a placeholder halide.Func) into
// those placeholders, so that a schedule can be applied to the copy without touching the
// caller's Funcs. `constants` (name -> int) replaces those variables in every definition and
// reduction domain of the copy: a copy compiled for some sizes, which only calls with those
// sizes may run.
void py_deep_copy(const py::sequence &outputs, const py::dict &into, const py::dict &constants) {
    std::map<std::string, int64_t> values;
    for (auto item : constants) {
        values[py::str(item.first)] = item.second.cast<int64_t>();
    }
    std::vector<HI::Function> outs = functions_of(outputs, "deep_copy");
    std::map<std::string, Halide::Func *> targets;
    for (auto item : into) {
        Halide::Func *f =
            pybind11_conduit_v1::get_type_pointer_ephemeral<Halide::Func>(item.second.ptr());
        if (f == nullptr) {
            PyErr_Clear();
            throw py::type_error("deep_copy: the placeholders must be halide.Func objects");
        }
        targets[py::str(item.first)] = f;
    }
    guarded([&] {
        std::map<std::string, HI::Function> env = HI::build_environment(outs);
        std::map<std::string, HI::Function> copies = HI::deep_copy(outs, env).second;
        if (!values.empty()) {
            ConstantSubstituter substitute(values);
            for (auto &c : copies) {
                c.second.mutate(&substitute);
            }
        }
        for (const auto &t : targets) {
            auto it = copies.find(t.first);
            if (it == copies.end()) {
                throw std::invalid_argument("deep_copy: no Func '" + t.first + "' in the pipeline");
            }
            *t.second = Halide::Func(it->second);
        }
        return 0;
    });
}

// The Params and ImageParams a pipeline reads, by name.
class ParameterFinder : public HI::IRGraphVisitor {
public:
    std::map<std::string, Halide::Parameter> found;

protected:
    using HI::IRGraphVisitor::visit;
    void visit(const HI::Call *op) override {
        if (op->param.defined()) {
            found.emplace(op->param.name(), op->param);
        }
        HI::IRGraphVisitor::visit(op);
    }
    void visit(const HI::Variable *op) override {
        if (op->param.defined()) {
            found.emplace(op->param.name(), op->param);
        }
    }
};

// The Buffers a pipeline's definitions read directly (an hl.Buffer embedded in the
// algorithm, not an ImageParam), by name: (type, [(min, extent)] innermost first, the bytes of
// a dense copy, innermost dimension fastest).
class BufferFinder : public HI::IRGraphVisitor {
public:
    std::map<std::string, Halide::Buffer<>> found;

protected:
    using HI::IRGraphVisitor::visit;
    void visit(const HI::Call *op) override {
        if (op->call_type == HI::Call::Image && op->image.defined()) {
            found.emplace(op->name, op->image);
        }
        HI::IRGraphVisitor::visit(op);
    }
};

py::dict py_embedded_buffers(const py::sequence &outputs) {
    BufferFinder finder;
    guarded([&] {
        std::vector<HI::Function> outs = functions_of(outputs, "embedded_buffers");
        std::map<std::string, HI::Function> env = HI::build_environment(outs);
        for (const auto &p : env) {
            p.second.accept(&finder);
        }
        return 0;
    });
    py::dict out;
    for (auto &item : finder.found) {
        Halide::Buffer<> dense = item.second.copy();  // (dense, same mins)
        py::list dims;
        for (int k = 0; k < dense.dimensions(); k++) {
            dims.append(py::make_tuple(dense.dim(k).min(), dense.dim(k).extent()));
        }
        out[py::str(item.first)] = py::make_tuple(
            type_to_str(dense.type()), dims,
            py::bytes(reinterpret_cast<const char *>(dense.data()), dense.size_in_bytes()));
    }
    return out;
}

// The pipeline of `outputs` as groups that share nothing: per output, the number of its group.
// Two outputs share a group where the Funcs they compute meet (one Func, not inlined, computed
// for both), or where a Func of one is computed, stored or fused (compute_with) in a loop of the
// other's.
// Each group can then be compiled as a pipeline of its own (aot.py compiles them side by side).
py::list py_output_groups(const py::sequence &outputs) {
    std::vector<int> parent;
    std::vector<std::set<std::string>> touched;
    guarded([&] {
        std::vector<HI::Function> outs = functions_of(outputs, "output_groups");
        for (const HI::Function &out : outs) {
            std::map<std::string, HI::Function> env = HI::find_transitive_calls(out);
            env.emplace(out.name(), out);
            std::set<std::string> names;
            for (auto &item : env) {
                // (locked as compiling locks them, which this precedes: an unlocked LoopLevel
                // cannot be inspected)
                item.second.lock_loop_levels();
                const HI::Function &f = item.second;
                if (f.schedule().compute_level().is_inlined() && f.name() != out.name()) {
                    continue;  // (inlined: each reader computes its own, `X_im` wrappers of inputs)
                }
                names.insert(f.name());
                for (const Halide::LoopLevel *level :
                     {&f.schedule().compute_level(), &f.schedule().store_level()}) {
                    if (level->locked() && !level->is_inlined() && !level->is_root()) {
                        names.insert(level->func());
                    }
                }
                std::vector<const HI::Definition *> stages{&f.definition()};
                for (const HI::Definition &u : f.updates()) {
                    stages.push_back(&u);
                }
                for (const HI::Definition *d : stages) {
                    const Halide::LoopLevel &fused = d->schedule().fuse_level().level;
                    if (d->defined() && fused.locked() && !fused.is_inlined() && !fused.is_root()) {
                        names.insert(fused.func());
                    }
                }
            }
            touched.push_back(std::move(names));
            parent.push_back(static_cast<int>(parent.size()));
        }
        return 0;
    });
    std::function<int(int)> root = [&](int k) { return parent[k] == k ? k : parent[k] = root(parent[k]); };
    for (size_t a = 0; a < touched.size(); a++) {
        for (size_t b = a + 1; b < touched.size(); b++) {
            const bool meet = std::any_of(touched[a].begin(), touched[a].end(),
                                          [&](const std::string &n) { return touched[b].count(n) > 0; });
            if (meet) {
                parent[root(static_cast<int>(b))] = root(static_cast<int>(a));
            }
        }
    }
    py::list out;
    std::map<int, int> numbers;  // (groups numbered in the order of their first output)
    for (size_t k = 0; k < parent.size(); k++) {
        const int r = root(static_cast<int>(k));
        if (!numbers.count(r)) {
            const int next = static_cast<int>(numbers.size());
            numbers[r] = next;
        }
        out.append(numbers[r]);
    }
    return out;
}

// Runs `body()` with the autoschedulers' estimates of the pipeline's inputs set to `buffers`
// (name -> [(min, extent)], innermost first) and `scalars` (name -> value), then puts the
// estimates the caller had back, whatever happens: a schedule is planned for a call's sizes
// without changing the caller's Params.
py::object py_with_estimates(const py::sequence &outputs, const py::dict &buffers,
                             const py::dict &scalars, const py::function &body) {
    std::vector<HI::Function> outs = functions_of(outputs, "with_estimates");
    ParameterFinder finder;
    guarded([&] {
        std::map<std::string, HI::Function> env = HI::build_environment(outs);
        for (const auto &p : env) {
            p.second.accept(&finder);
        }
        return 0;
    });
    struct Saved {
        Halide::Parameter param;
        std::vector<std::pair<Expr, Expr>> dims;  // buffers: (min, extent) estimates
        Expr scalar;
    };
    std::vector<Saved> saved;
    auto restore = [&] {
        for (Saved &s : saved) {
            if (s.param.is_buffer()) {
                for (size_t k = 0; k < s.dims.size(); k++) {
                    s.param.set_min_constraint_estimate((int)k, s.dims[k].first);
                    s.param.set_extent_constraint_estimate((int)k, s.dims[k].second);
                }
            } else {
                s.param.set_estimate(s.scalar);
            }
        }
    };
    try {
        for (auto item : buffers) {
            std::string name = py::str(item.first);
            auto it = finder.found.find(name);
            if (it == finder.found.end() || !it->second.is_buffer()) {
                continue;  // (an input the outputs never read)
            }
            Halide::Parameter param = it->second;
            py::sequence dims = item.second.cast<py::sequence>();
            if ((int)py::len(dims) != param.dimensions()) {
                throw py::value_error("with_estimates: '" + name + "' has " +
                                      std::to_string(param.dimensions()) + " dimensions");
            }
            Saved s{param, {}, Expr()};
            for (int k = 0; k < param.dimensions(); k++) {
                s.dims.emplace_back(param.min_constraint_estimate(k),
                                    param.extent_constraint_estimate(k));
            }
            saved.push_back(s);
            for (int k = 0; k < param.dimensions(); k++) {
                py::sequence pair = dims[k].cast<py::sequence>();
                param.set_min_constraint_estimate(k, expr_from_py(pair[0], "with_estimates"));
                param.set_extent_constraint_estimate(k, expr_from_py(pair[1], "with_estimates"));
            }
        }
        for (auto item : scalars) {
            std::string name = py::str(item.first);
            auto it = finder.found.find(name);
            if (it == finder.found.end() || it->second.is_buffer()) {
                continue;
            }
            Halide::Parameter param = it->second;
            saved.push_back(Saved{param, {}, param.estimate()});
            Expr value = expr_from_py(item.second, "with_estimates");
            guarded([&] {
                param.set_estimate(Halide::cast(param.type(), value));
                return 0;
            });
        }
        py::object result = body();
        restore();
        return result;
    } catch (...) {
        restore();
        throw;
    }
}
// -- compiling without the GIL ------------------------------------------------------------------

// Halide's Python bindings hold the GIL while they compile: two seconds of LLVM for a
// convolution's backward, during which no other Python thread runs. These two compile with
// the GIL released, so that tcstage compiles a layer's backward on another thread while the
// forward compiles and runs (tcstage/halide/aot.py). Halide's compiler is thread-safe for
// separate pipelines; the bindings' warning printer takes the GIL back itself.

template <typename T>
T &bound(const py::handle &obj, const char *what, const char *expected) {
    T *p = pybind11_conduit_v1::get_type_pointer_ephemeral<T>(obj.ptr());
    if (p == nullptr) {
        PyErr_Clear();
        std::string tname = py::str(py::type::handle_of(obj).attr("__name__"));
        throw py::type_error(std::string(what) + ": expected a halide." + expected +
                             ", got an object of type '" + tname + "'");
    }
    return *p;
}

void py_compile_object(const py::object &pipeline, const std::string &path,
                       const py::list &arguments, const std::string &name,
                       const py::object &target) {
    Halide::Pipeline p = bound<Halide::Pipeline>(pipeline, "compile_object", "Pipeline");
    const Halide::Target t = bound<Halide::Target>(target, "compile_object", "Target");
    std::vector<Halide::Argument> args;
    for (const py::handle &a : arguments) {
        if (auto *image = pybind11_conduit_v1::get_type_pointer_ephemeral<Halide::ImageParam>(a.ptr())) {
            args.emplace_back(*image);
        } else {
            PyErr_Clear();
            args.emplace_back(bound<Halide::Param<void>>(a, "compile_object", "Param or ImageParam"));
        }
    }
    guarded([&] {
        py::gil_scoped_release unlocked;
        p.compile_to({{Halide::OutputFileType::object, path}}, args, name, t);
        return 0;
    });
}

void py_compile_runtime(const std::string &path, const py::object &target) {
    const Halide::Target t = bound<Halide::Target>(target, "compile_runtime", "Target");
    guarded([&] {
        py::gil_scoped_release unlocked;
        Halide::compile_standalone_runtime(path, t);
        return 0;
    });
}

// -- calling a compiled pipeline --------------------------------------------------------------

// An argument's type is given as a `kind`: a buffer of Halide type (code << 8 | bits) when
// >= 0, a scalar of type -(code << 8 | bits) - 1 otherwise (halide_type_code_t codes: 0 int,
// 1 uint, 2 float, 4 bfloat).
using Entry = int (*)(void **);

// Writes the Python number `value` into `slot` as a scalar of `kind` (< 0).
void write_scalar(void *slot, int kind, const py::handle &value) {
    const int type = -kind - 1, code = type >> 8, bits = type & 255;
    if (code == halide_type_float && bits == 32) {
        const float v = py::cast<float>(value);
        std::memcpy(slot, &v, sizeof v);
    } else if (code == halide_type_float && bits == 64) {
        const double v = py::cast<double>(value);
        std::memcpy(slot, &v, sizeof v);
    } else if (code == halide_type_uint && bits == 1) {
        const bool v = py::cast<bool>(value);
        std::memcpy(slot, &v, sizeof v);
    } else if (code == halide_type_int || code == halide_type_uint) {
        // (two's complement: the low `bits` of the value, in place for little and big endian
        // alike through the typed copies)
        const long long v = py::cast<long long>(value);
        if (bits == 8) { const int8_t w = static_cast<int8_t>(v); std::memcpy(slot, &w, 1); }
        else if (bits == 16) { const int16_t w = static_cast<int16_t>(v); std::memcpy(slot, &w, 2); }
        else if (bits == 32) { const int32_t w = static_cast<int32_t>(v); std::memcpy(slot, &w, 4); }
        else if (bits == 64) { const int64_t w = static_cast<int64_t>(v); std::memcpy(slot, &w, 8); }
        else throw std::invalid_argument("an integer scalar of " + std::to_string(bits) + " bits");
    } else {
        throw std::invalid_argument("a scalar of type code " + std::to_string(code));
    }
}

// A buffer header of type `kind` (>= 0) over `dims`, its host pointer unset.
halide_buffer_t buffer_header(int kind, std::vector<halide_dimension_t> &dims) {
    halide_buffer_t b;
    b.device = 0;
    b.device_interface = nullptr;
    b.host = nullptr;
    b.flags = 0;
    b.type.code = static_cast<halide_type_code_t>(kind >> 8);
    b.type.bits = static_cast<uint8_t>(kind & 255);
    b.type.lanes = 1;
    b.dimensions = static_cast<int32_t>(dims.size());
    b.dim = dims.data();
    b.padding = nullptr;
    return b;
}

// One dimension per axis, Halide's dimension 0 being numpy's last axis: `shape`, `strides`
// (in elements) and `mins` in numpy's order (mins None for all zero).
std::vector<halide_dimension_t> dimensions(const py::sequence &shape, const py::sequence &strides,
                                           const py::object &mins) {
    const int ndim = static_cast<int>(py::len(shape));
    std::vector<halide_dimension_t> dims(ndim);
    for (int d = 0; d < ndim; ++d) {
        const int axis = ndim - 1 - d;
        dims[d].min = mins.is_none() ? 0 : py::cast<int>(py::sequence(mins)[axis]);
        dims[d].extent = py::cast<int32_t>(shape[axis]);
        dims[d].stride = py::cast<int32_t>(strides[axis]);
        dims[d].flags = 0;
    }
    return dims;
}

int run_entry(std::uintptr_t entry, std::vector<void *> &argv) {
    py::gil_scoped_release unlocked;
    return reinterpret_cast<Entry>(entry)(argv.data());
}

// Runs a pipeline's `<name>_argv` entry point (an ahead-of-time compiled library's; see
// tcstage/halide/aot.py) on numpy arrays and Python numbers, `kinds[k]` saying what args[k]
// is. `mins` maps an argument's index to its buffer's minimum coordinates, numpy's order,
// where not all zero. Building the halide_buffer_t structs here instead of halide.Buffer
// objects and a ctypes argument vector saves several microseconds of a small kernel's call;
// the GIL is released while the pipeline runs. Returns the pipeline's status (nonzero: its
// error handler has the message).
int py_call_argv(std::uintptr_t entry, const py::list &args, const py::list &kinds,
                 const py::dict &mins) {
    const size_t n = args.size();
    if (kinds.size() != n) {
        throw std::invalid_argument("call_argv: one kind per argument");
    }
    std::vector<halide_buffer_t> buffers(n);
    std::vector<std::vector<halide_dimension_t>> dims(n);
    std::vector<std::uint64_t> scalars(n, 0);
    std::vector<void *> argv(n, nullptr);
    for (size_t k = 0; k < n; ++k) {
        const int kind = kinds[k].cast<int>();
        if (kind < 0) {
            write_scalar(&scalars[k], kind, args[k]);
            argv[k] = &scalars[k];
            continue;
        }
        if (!py::isinstance<py::array>(args[k])) {
            throw std::invalid_argument("call_argv: argument " + std::to_string(k) +
                                        " is not a numpy array");
        }
        auto a = py::reinterpret_borrow<py::array>(args[k]);
        const auto itemsize = static_cast<py::ssize_t>(a.itemsize());
        py::object at = mins.contains(py::int_(k)) ? py::object(mins[py::int_(k)]) : py::none();
        const int ndim = static_cast<int>(a.ndim());
        dims[k].resize(ndim);
        for (int d = 0; d < ndim; ++d) {  // (as `dimensions`, read from the array)
            const int axis = ndim - 1 - d;
            dims[k][d].min = at.is_none() ? 0 : py::cast<int>(py::sequence(at)[axis]);
            dims[k][d].extent = static_cast<int32_t>(a.shape(axis));
            dims[k][d].stride = static_cast<int32_t>(a.strides(axis) / itemsize);
            dims[k][d].flags = 0;
        }
        buffers[k] = buffer_header(kind, dims[k]);
        buffers[k].host = static_cast<uint8_t *>(const_cast<void *>(a.data()));
        argv[k] = &buffers[k];
    }
    return run_entry(entry, argv);
}

// A call of an entry point whose buffers' layouts are fixed (a call like one made before:
// tcstage's memo of such calls keys them on shapes, strides and types), made once so that each
// call only sets the buffers' host pointers and the values of the scalars that change from call
// to call (a float's: a loss passed to its backward; an integer's, which can decide sizes, is
// fixed with the layouts). A small kernel's call through it costs a microsecond or so, where
// call_argv's builds every header.
class PreparedCall {
public:
    // kinds: per argument as above; layouts: per argument, None for a scalar, else
    // (shape, strides in elements, mins or None), numpy's order; scalars: per argument, the
    // value of a fixed scalar, None for a buffer or for a scalar passed with each call.
    PreparedCall(std::uintptr_t entry, const py::list &kinds, const py::list &layouts,
                 const py::list &scalars)
        : entry_(entry), dims_(kinds.size()), scalars_(kinds.size(), 0) {
        const size_t n = kinds.size();
        if (layouts.size() != n || scalars.size() != n) {
            throw std::invalid_argument("PreparedCall: one kind, layout and scalar per argument");
        }
        for (size_t k = 0; k < n; ++k) {
            const int kind = kinds[k].cast<int>();
            if (kind < 0) {
                if (scalars[k].is_none()) {
                    passed_.push_back({k, kind, 0});
                } else {
                    write_scalar(&scalars_[k], kind, scalars[k]);
                }
                continue;
            }
            py::tuple layout = layouts[k].cast<py::tuple>();
            dims_[k] = dimensions(layout[0], layout[1], layout[2]);
            passed_.push_back({k, kind, headers_.size()});
            headers_.push_back(buffer_header(kind, dims_[k]));
        }
    }

    // Runs on `values`: per argument passed with each call, in argument order, a buffer's data
    // address (an int) or numpy array, or a scalar's value. Each call fills copies of the
    // headers and scalars, so concurrent calls share nothing mutable.
    int operator()(const py::list &values) const {
        if (values.size() != passed_.size()) {
            throw std::invalid_argument("PreparedCall: " + std::to_string(passed_.size()) +
                                        " arguments per call, got " +
                                        std::to_string(values.size()));
        }
        std::vector<halide_buffer_t> headers(headers_);
        std::vector<std::uint64_t> scalars(scalars_);
        std::vector<void *> argv(scalars.size());
        for (size_t k = 0; k < argv.size(); ++k) {
            argv[k] = &scalars[k];
        }
        for (size_t j = 0; j < passed_.size(); ++j) {
            const Passed &p = passed_[j];
            py::handle value = values[j];
            if (p.kind < 0) {
                write_scalar(&scalars[p.argument], p.kind, value);
                continue;
            }
            halide_buffer_t &header = headers[p.header];
            if (PyLong_Check(value.ptr())) {
                header.host = static_cast<uint8_t *>(PyLong_AsVoidPtr(value.ptr()));
                if (PyErr_Occurred()) {
                    throw py::error_already_set();
                }
            } else if (py::isinstance<py::array>(value)) {
                header.host = static_cast<uint8_t *>(
                    const_cast<void *>(py::reinterpret_borrow<py::array>(value).data()));
            } else {
                throw std::invalid_argument("PreparedCall: argument " +
                                            std::to_string(p.argument) +
                                            " is neither an address nor a numpy array");
            }
            argv[p.argument] = &header;
        }
        return run_entry(entry_, argv);
    }

private:
    struct Passed {
        size_t argument;  // its index among the entry point's arguments
        int kind;
        size_t header;    // a buffer's index in headers_
    };
    std::uintptr_t entry_;
    std::vector<std::vector<halide_dimension_t>> dims_;  // (read only: headers point here)
    std::vector<std::uint64_t> scalars_;
    std::vector<halide_buffer_t> headers_;
    std::vector<Passed> passed_;  // the arguments passed with each call, in order
};

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = R"doc(Bridge to Halide's internal solver and simplifier.

Import ``halide`` before this module.  Arguments are ``halide.Expr`` objects
(or Python ints, taken as int32 constants).  Results are expression trees made
of nested tuples whose first element is a tag:

  ('int', v)                  integer constant (v is True/False for bool consts)
  ('float', v)                float constant
  ('var', name)               variable
  (op, a, b)                  op in add sub mul div mod min max
                                    eq ne lt le gt ge and or
                              (div/mod follow Halide: floor/Euclidean, x/0 == 0)
  ('not', a)
  ('select', cond, t, f)
  ('cast', type_str, a)       type_str like 'int32', 'float32', 'uint8', 'bool'
  ('read', name, (args...))   read of a Func or input buffer (args innermost first)
  ('call', name, (args...))   any other call
  ('let', name, value, body)

Other Halide node types raise ValueError naming the node type.
)doc";

    m.def("variable", &py_variable, py::arg("out"), py::arg("name"), py::arg("like"),
          "Write a variable `name` of the type of `like` into the Expr out.");
    m.def("let", &py_let, py::arg("out"), py::arg("name"), py::arg("value"), py::arg("body"),
          "Write `let name = value in body` into the Expr out.");
    m.def("math_call", &py_math_call, py::arg("out"), py::arg("name"), py::arg("arg"),
          "Write the call `name(arg)` of a C math function (a PureExtern) into the Expr out.");
    m.def("to_tree", &py_to_tree, py::arg("expr"),
          "Convert a halide.Expr (unchanged) into a tuple tree.");
    m.def("func_definitions", &py_func_definitions, py::arg("func"),
          "A halide.Func's definitions as plain data: {'name', 'args' (pure argument\n"
          "names, innermost first), 'definitions': [{'kind': 'pure'|'update', 'args',\n"
          "'values', 'predicate' (trees), 'rvars': ((name, min, extent), ...)}]}.");
    m.def("address", [](const py::array &a) { return reinterpret_cast<std::uintptr_t>(a.data()); },
          py::arg("array"),
          "The address of a numpy array's first element (numpy's own ways, `ctypes.data` and "
          "`__array_interface__`, cost microseconds).");
    m.def("call_argv", &py_call_argv, py::arg("entry"), py::arg("args"), py::arg("kinds"),
          py::arg("mins"),
          "Run a compiled pipeline's `<name>_argv` entry point (its address) on numpy arrays\n"
          "and numbers: see the C++ comment for `kinds` and `mins`; returns its status.");
    m.def("compile_object", &py_compile_object, py::arg("pipeline"), py::arg("path"),
          py::arg("arguments"), py::arg("name"), py::arg("target"),
          "Pipeline.compile_to an object file, with the GIL released while Halide compiles.");
    m.def("compile_runtime", &py_compile_runtime, py::arg("path"), py::arg("target"),
          "compile_standalone_runtime, with the GIL released while Halide compiles.");
    py::class_<PreparedCall>(m, "PreparedCall",
                             "A call of an entry point with fixed buffer layouts (and fixed scalars).")
        .def(py::init<std::uintptr_t, const py::list &, const py::list &, const py::list &>(),
             py::arg("entry"), py::arg("kinds"), py::arg("layouts"), py::arg("scalars"))
        .def("__call__", &PreparedCall::operator(), py::arg("values"),
             "Run on the buffers' addresses (ints) or numpy arrays and the scalars passed "
             "with each call, in argument order; returns the status.");
    m.def("simplify", &py_simplify, py::arg("expr"),
          "Simplify a halide.Expr with Halide's simplifier and return the tree.");
    m.def("solve_for_inner_interval", &py_solve_for_inner_interval, py::arg("cond"),
          py::arg("var_name"),
          "Largest interval of `var_name` on which the boolean `cond` surely holds.\n"
          "Returns (lo, hi): inclusive bound trees (simplified), None for an\n"
          "unbounded end; an empty result is reported as (('int', 1), ('int', 0)).");
    m.def("and_condition_over_domain", &py_and_condition_over_domain, py::arg("cond"),
          py::arg("domain"),
          "Relax the boolean `cond` into a condition free of the variables in\n"
          "`domain` ({name: (lo, hi)} with inclusive bounds) that implies `cond`\n"
          "for every value of those variables; the result is simplified.");

    m.def("embedded_buffers", &py_embedded_buffers, py::arg("outputs"),
          "The Buffers the definitions read directly: name -> (type, [(min, extent)] "
          "innermost first, bytes of a dense copy).");
    m.def("output_groups", &py_output_groups, py::arg("outputs"),
          "Per output, the number of its group: outputs whose Funcs (or loops they are\n"
          "computed in) meet share a group; groups can be compiled as pipelines of their own.");
    m.def("pipeline_functions", &py_pipeline_functions, py::arg("outputs"),
          "Every Func the pipeline of `outputs` computes, producers first, as\n"
          "func_definitions gives them, plus 'types' (value types) and 'extern'.");
    m.def("required_regions", &py_required_regions, py::arg("outputs"), py::arg("boxes"),
          py::arg("known"),
          "Halide's bounds inference from the outputs' boxes (per output, per dimension\n"
          "innermost first, inclusive (min, max)): {Func or input name: [(min, max) trees]}\n"
          "(None for an unbounded end). `known`: {variable: value or (lo, hi)}.");
    m.def("inlined_functions", &py_inlined_functions, py::arg("outputs"),
          "Names of the pipeline's Funcs (outputs excluded) computed inline.");
    m.def("compute_root", &py_compute_root, py::arg("outputs"), py::arg("names"),
          "Compute the named Funcs of the pipeline at the root.");
    m.def("scheduled_functions", &py_scheduled_functions, py::arg("outputs"),
          "Names of the pipeline's Funcs that carry a schedule (splits, loop types, or an "
          "intermediate not computed inline).");
    m.def("deep_copy", &py_deep_copy, py::arg("outputs"), py::arg("into"),
          py::arg("constants") = py::dict(),
          "Copy the pipeline's Funcs (with their schedules) into placeholder Funcs, by name, "
          "with the variables named in constants replaced by their values.");
    m.def("with_estimates", &py_with_estimates, py::arg("outputs"), py::arg("buffers"),
          py::arg("scalars"), py::arg("body"),
          "Call body() with the inputs' estimates set, then restore the previous ones.");
}
