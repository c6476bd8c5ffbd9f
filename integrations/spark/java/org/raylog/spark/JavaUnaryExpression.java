package org.raylog.spark;

import java.io.Serializable;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.util.Collections;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback;
import org.apache.spark.sql.catalyst.expressions.codegen.ExprCode;
import org.apache.spark.sql.catalyst.trees.TreeNode;
import org.apache.spark.sql.types.DataType;

import scala.collection.IndexedSeq;
import scala.collection.JavaConverters;
import scala.collection.Seq;

/**
 * A Catalyst expression of one child written in Java (Spark's
 * {@code UnaryExpression} cannot be extended from Java: its final
 * {@code withNewChildrenInternal} does not type-check there): null for a null
 * child value, else {@link #nullSafeEval}. Generated code calls
 * {@link #eval} (Spark's {@code CodegenFallback}, whose implementation is
 * reached by reflection: javac does not see Scala's trait forwarders).
 * Immutable but for the evaluation state of subclasses.
 */
abstract class JavaUnaryExpression extends Expression implements CodegenFallback, Serializable {

  private static final long serialVersionUID = 1L;
  private static volatile Method fallback;

  private final Expression child;
  private transient Seq<Expression> children;

  JavaUnaryExpression(Expression child) {
    this.child = child;
  }

  /** The value of a non-null child value. */
  abstract Object nullSafeEval(Object input);

  /** This expression over {@code newChild}. */
  abstract Expression withNewChild(Expression newChild);

  public Expression child() {
    return child;
  }

  @Override
  public Seq<Expression> children() {
    if (children == null) {
      children = JavaConverters.asScalaBuffer(Collections.singletonList(child)).toList();
    }
    return children;
  }

  @Override
  public Object eval(InternalRow input) {
    Object value = child.eval(input);
    return value == null ? null : nullSafeEval(value);
  }

  @Override
  public Expression withNewChildrenInternal(IndexedSeq<Expression> newChildren) {
    return withNewChild(newChildren.apply(0));
  }

  @Override
  public ExprCode doGenCode(CodegenContext ctx, ExprCode ev) {
    try {
      if (fallback == null) {
        fallback = CodegenFallback.class.getMethod("doGenCode$", CodegenFallback.class, CodegenContext.class,
            ExprCode.class);
      }
      return (ExprCode) fallback.invoke(null, this, ctx, ev);
    } catch (InvocationTargetException e) {
      Throwable cause = e.getCause();
      throw cause instanceof RuntimeException ? (RuntimeException) cause : new IllegalStateException(cause);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("this Spark has no CodegenFallback.doGenCode$: " + e, e);
    }
  }

  @Override
  public int productArity() {
    return 1;
  }

  @Override
  public Object productElement(int n) {
    if (n == 0) {
      return child;
    }
    throw new IndexOutOfBoundsException(String.valueOf(n));
  }

  @Override
  public boolean canEqual(Object that) {
    return that != null && that.getClass() == getClass();
  }

  @Override
  public abstract DataType dataType();
}
